"""The chart installed, upgraded and uninstalled for real: Helm's own release actions (helm-python-sdk)
against the real API server, as cluster-admin would run `helm install`.

What counts is what the API server holds afterwards: the CRDs Established, every object a render with the
same release name, namespace and values produces, owned by the release; after an upgrade the changed
values in place and the objects the new values no longer render removed; after uninstall none of the
release's objects left. There is no kubelet, so nothing waits for Deployments or DaemonSets to be ready
(Helm's `--wait` is off, as in a plain `helm install`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml
from tessera.api import contract

from tests.unit.chart.chart_render import CHART, chart_crds, objects, render

from .controlplane import K8S_VERSION, ControlPlane, wait_until

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "DeviceClass",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
}


def api_path(obj: dict[str, Any]) -> str:
    """The object's URL; every kind the chart renders has the plural `<kind lowercased>s` (`-ies` for `-y`)."""
    group_version = obj["apiVersion"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    meta = obj["metadata"]
    scope = "" if obj["kind"] in CLUSTER_SCOPED else f"/namespaces/{meta['namespace']}"
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
    return f"{base}{scope}/{plural}/{meta['name']}"


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def release_render(release: str, namespace: str, values: dict[str, Any] | None) -> list[dict[str, Any]]:
    objs = objects(render(values, name=release, namespace=namespace))
    for obj in objs:
        assert obj["kind"] in CLUSTER_SCOPED or obj["metadata"].get("namespace"), key(obj)
    return objs


def assert_held(
    cluster: ControlPlane, release: str, objs: list[dict[str, Any]]
) -> dict[tuple[str, str, str], Any]:
    """Every rendered object is on the server, owned by the release; returns them as the server holds them."""
    held = {}
    for obj in objs:
        live = cluster.get(api_path(obj))
        assert live is not None, f"{key(obj)} is not on the server"
        annotations = live["metadata"].get("annotations") or {}
        assert annotations.get("meta.helm.sh/release-name") == release, key(obj)
        assert obj["metadata"].get("labels", {}).items() <= live["metadata"].get("labels", {}).items()
        held[key(obj)] = live
    return held


def operator_args(held: dict[tuple[str, str, str], Any], namespace: str, release: str) -> str:
    deploy = held["Deployment", namespace, f"{release}-tessera-operator"]
    return str(deploy["spec"]["template"]["spec"]["containers"][0]["args"][0])


def manifest_objects(release: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(release["manifest"]) if o]


@pytest.fixture
def release_namespace(cluster: ControlPlane) -> Iterator[str]:
    """A fresh namespace for the release (Helm creates it, as `helm install --create-namespace`)."""
    name = f"rel-{secrets.token_hex(4)}"
    yield name
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")


def test_install_upgrade_uninstall(cluster: ControlPlane, release_namespace: str) -> None:
    ns = release_namespace
    release = f"r{secrets.token_hex(3)}"  # not the chart's name: every object is prefixed <release>-tessera
    with helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=ns) as cfg:
        # --- install with the defaults a user starts from ---------------------------------------------
        installed = cfg.install(CHART, release, None, create_namespace=True, timeout=300)
        assert (installed["status"], installed["revision"]) == ("deployed", 1)
        # The CRDs are the chart's (crds/): Helm applies them before the templates, or finds them there.
        for crd in chart_crds():
            name = crd["metadata"]["name"]
            wait_until(
                lambda n=name: any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (
                        cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}") or {}
                    )
                    .get("status", {})
                    .get("conditions", [])
                ),
                60,
                f"CRD {name} to be Established",
            )
        first = release_render(release, ns, None)
        # What Helm applied is what the chart renders offline with the same values (same objects).
        assert sorted(map(key, manifest_objects(installed))) == sorted(map(key, first))
        held = assert_held(cluster, release, first)
        assert {k[0] for k in held} >= {"Deployment", "DaemonSet", "ClusterRole", "ClusterKopfPeering"}
        assert "--all-namespaces" in operator_args(held, ns, release)
        assert "--lease-seconds 600" in operator_args(held, ns, release)
        assert not [k for k in held if k[0] == "ServiceMonitor"]
        # The scheduler pod's kube-scheduler follows the API server's version (the tag is left empty).
        scheduler = held["Deployment", ns, f"{release}-tessera-scheduler"]["spec"]["template"]["spec"]
        images = {c["name"]: c["image"] for c in scheduler["containers"]}
        assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{K8S_VERSION}"
        # The custom resources the operator serves are usable as soon as the install returns.
        status, body = cluster.request(
            "POST",
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.PLURAL_APP}",
            {
                "apiVersion": contract.API_VERSION,
                "kind": "App",
                "metadata": {"name": "smoke"},
                "spec": {
                    "template": {"spec": {"containers": [{"name": "c", "image": "trainer:1"}]}},
                    "jobs": [{"name": "j", "iterTotal": 10, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1}],
                },
            },
        )
        assert status == 201, body

        # --- upgrade: new values take effect, objects they no longer render go ----------------------------
        values = {
            "operator": {"replicas": 3, "allNamespaces": False, "themis": {"leaseSeconds": 300}},
            # Asked for on a cluster without prometheus-operator: skipped (with a warning), not a failure.
            "serviceMonitor": {"enabled": True},
            # No kubelet here runs the uninstall hook's Job (tests/integration/node runs it).
            "agent": {"cleanupOnUninstall": False},
            # Installs the namespace routing (the cluster's own version passes the chart's 1.36+ check).
            "gpuNodes": {"reserve": True},
        }
        upgraded = cfg.upgrade(CHART, release, values, timeout=300)
        assert (upgraded["status"], upgraded["revision"]) == ("deployed", 2)
        assert "WARNING: serviceMonitor.enabled" in upgraded["notes"]
        second = release_render(release, ns, values)
        assert sorted(map(key, manifest_objects(upgraded))) == sorted(map(key, second))
        held = assert_held(cluster, release, second)
        deploy = held["Deployment", ns, f"{release}-tessera-operator"]
        assert deploy["spec"]["replicas"] == 3
        args = operator_args(held, ns, release)
        assert (
            "--lease-seconds 300" in args and f"--namespace {ns}" in args and "--all-namespaces" not in args
        )
        assert ("Role", ns, f"{release}-tessera-operator") in held
        assert ("KopfPeering", ns, "tessera") in held
        assert {k[0] for k in held} >= {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
        gone = {key(o): o for o in first}.keys() - {key(o) for o in second}
        assert gone == {("ClusterKopfPeering", "", "tessera")}
        for k in gone:
            (obj,) = [o for o in first if key(o) == k]
            wait_until(lambda o=obj: cluster.request("GET", api_path(o))[0] == 404, 60, f"{k} to be removed")

        # --- uninstall: nothing of the release is left, the CRDs and the users' resources stay -------------
        cfg.uninstall(release, timeout=300)
        for obj in second:
            wait_until(
                lambda o=obj: cluster.request("GET", api_path(o))[0] == 404, 120, f"{key(obj)} to be deleted"
            )
        assert cfg.list(all_states=True) == []  # its history (release Secrets) went too
        for crd in chart_crds():
            assert cluster.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            )
        smoke = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.PLURAL_APP}/smoke"
        assert cluster.get(smoke) is not None
        assert cluster.request("DELETE", smoke)[0] == 200
