"""The chart's scheduler serves the extender verbs to kube-scheduler only: loopback, or TLS with client
certificates; no Service exposes /bind unless it needs a client certificate; metrics stay scrapable."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from .chart_render import CHART, find, objects, render

TLS = {
    "scheduler": {
        "extender": {
            "tls": {
                "enabled": True,
                "secretName": "extender-tls",
                "clientSecretName": "scheduler-client-tls",
                "serverName": "tessera-extender",
            }
        }
    }
}


def _extender(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    pod = find(objs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    config = yaml.safe_load(find(objs, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    return pod, containers, config["extenders"][0]


def test_by_default_the_verbs_listen_on_loopback_and_no_service_exposes_them() -> None:
    objs = objects(render())
    _, containers, ext = _extender(objs)
    args = containers["extender"]["args"]
    assert "--host=127.0.0.1" in args and not any(a.startswith("--tls") for a in args)
    assert ext["urlPrefix"].startswith("http://127.0.0.1:") and ext["enableHTTPS"] is False
    assert {p["name"] for p in containers["extender"]["ports"]} == {"metrics"}
    service = find(objs, "Service", "-scheduler-extender")
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert containers["extender"][probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_tls_requires_client_certificates_both_ways() -> None:
    objs = objects(render(TLS))
    pod, containers, ext = _extender(objs)
    args = containers["extender"]["args"]
    assert "--host=0.0.0.0" in args
    assert "--tls-client-ca-file=/etc/tessera-extender/tls/ca.crt" in args
    assert ext["urlPrefix"].startswith("https://127.0.0.1:") and ext["enableHTTPS"] is True
    assert ext["tlsConfig"] == {
        "certFile": "/etc/tessera-scheduler/client-tls/tls.crt",
        "keyFile": "/etc/tessera-scheduler/client-tls/tls.key",
        "caFile": "/etc/tessera-scheduler/client-tls/ca.crt",
        "serverName": "tessera-extender",
    }
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"tls": "extender-tls", "client-tls": "scheduler-client-tls"}
    mounts = {m["name"] for c in containers.values() for m in c.get("volumeMounts", [])}
    assert {"tls", "client-tls"} <= mounts
    service = find(objs, "Service", "-scheduler-extender")
    assert sorted(p["name"] for p in service["spec"]["ports"]) == ["extender", "metrics"]


def test_tls_without_its_secrets_is_refused_by_the_schema() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match="secretName"):
        chart.validate_schema({"scheduler": {"extender": {"tls": {"enabled": True}}}})
