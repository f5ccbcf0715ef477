"""lanes.api auto against real API servers: with consumable capacity on (the default from 1.36) the agent and
the operator choose DRA lanes; with kube-apiserver --feature-gates=DRAConsumableCapacity=false, which still
serves resource.k8s.io/v1 but drops the fields, both fall back to the device plugin and say why in a Warning
Event. Each runs under the ServiceAccount and grants of a release rendered with auto for a 1.37 cluster."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tessera.api import contract
from tessera.dra_support import FEATURE_GATE, REASON_FALLBACK, operator_lanes_api
from tessera.kube import KubeClient, KubeConfig
from tessera_agent import cli as agent_cli
from tessera_agent.kubelet.dra_auto import agent_lanes_api

from tests.requires import missing

from .admin_cli import find_cli
from .conftest import RBAC_KINDS, RELEASE_NS, request_token
from .controlplane import ROOT, ControlPlane, NoBinaries, control_plane, wait_until

RELEASE = "tessera-auto"
SLOTS = 4


@pytest.fixture(scope="module")
def auto_release() -> list[dict[str, Any]]:
    """The chart with lanes.api auto as Helm renders it for a 1.37 API server serving resource.k8s.io/v1
    (what `helm install` reads from the cluster, given here: the Python renderer takes no capabilities)."""
    try:
        cli = find_cli()
    except NoBinaries as err:
        missing(f"no Helm CLI: {err}")
    proc = subprocess.run(
        [str(cli / "helm"), "template", RELEASE, "charts/tessera", "-n", RELEASE_NS, "--kube-version", "v1.37.2",
         "--api-versions", "resource.k8s.io/v1/DeviceClass", "--set", "lanes.api=auto"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def gate_off() -> Iterator[ControlPlane]:
    try:
        plane = control_plane(apiserver_args=(f"--feature-gates={FEATURE_GATE}=false",))
        cp = plane.__enter__()
    except NoBinaries as err:
        missing(f"no Kubernetes control plane: {err}")
    try:
        yield cp
    finally:
        plane.__exit__(None, None, None)


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""))


def _clients(cluster: ControlPlane, objs: list[dict[str, Any]]) -> dict[str, KubeClient]:
    """The release's RBAC applied; the agent's and the operator's clients under their ServiceAccounts."""
    cluster.kubectl("create", "namespace", RELEASE_NS, check=False)
    docs = [o for o in objs if o["kind"] in RBAC_KINDS]
    cluster.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
    out = {}
    for d in docs:
        if d["kind"] == "ServiceAccount" and _component(d) in ("agent", "operator"):
            token = request_token(cluster, RELEASE_NS, d["metadata"]["name"])
            path = cluster.write_kubeconfig(cluster.workdir / f"{_component(d)}-auto.kubeconfig", token=token)
            out[_component(d)] = KubeClient(KubeConfig.from_kubeconfig(path))
    return out


async def _choices(cluster: ControlPlane, objs: list[dict[str, Any]], node: str, pod: str) -> tuple[str, str]:
    clients = _clients(cluster, objs)
    try:
        return (
            await agent_lanes_api(clients["agent"], node, SLOTS),
            await operator_lanes_api(clients["operator"], RELEASE_NS, pod),
        )
    finally:
        for c in clients.values():
            await c.close()


def _fallback_events(cluster: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    got = cluster.get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={name},reason={REASON_FALLBACK}"
    )
    return list((got or {}).get("items") or [])


def test_auto_runs_both_components_with_the_choice_left_to_them(auto_release: list[dict[str, Any]]) -> None:
    agent = next(o for o in auto_release if o["kind"] == "DaemonSet" and _component(o) == "agent")
    args = agent_cli.build_parser().parse_args(agent["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.lanes_api == "auto"
    # both paths ready: the DRA driver's directories and the device plugin's
    assert str(args.kubelet_plugins_dir).endswith("/plugins") and str(args.device_plugin_dir)
    mounts = {m["name"] for m in agent["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert {"kubelet-plugins", "kubelet-plugins-registry", "cdi", "device-plugins"} <= mounts
    operator = next(o for o in auto_release if o["kind"] == "Deployment" and _component(o) == "operator")
    assert "--lanes-api auto" in " ".join(operator["spec"]["template"]["spec"]["containers"][0]["args"])
    (dc,) = [o for o in auto_release if o["kind"] == "DeviceClass"]
    # Not naming tessera.io/gpu by default: a component may fall back to the device plugin, whose pods asking
    # tessera.io/gpu-memory kube-scheduler would then refuse (docs/dra.md, "Pods that ask for tessera.io/gpu").
    assert "extendedResourceName" not in dc["spec"]


def test_with_consumable_capacity_on_both_choose_dra(
    cluster: ControlPlane, auto_release: list[dict[str, Any]]
) -> None:
    node, pod = f"auto-on-{secrets.token_hex(3)}", f"operator-{secrets.token_hex(3)}"
    assert asyncio.run(_choices(cluster, auto_release, node, pod)) == ("dra", "dra")
    assert _fallback_events(cluster, "default", node) == []
    assert _fallback_events(cluster, RELEASE_NS, pod) == []


def test_with_consumable_capacity_off_both_fall_back_and_say_why(
    gate_off: ControlPlane, auto_release: list[dict[str, Any]]
) -> None:
    cluster = gate_off
    assert cluster.get("/apis/resource.k8s.io/v1")  # v1 served all the same: the version check alone says dra
    node, pod = f"auto-off-{secrets.token_hex(3)}", f"operator-{secrets.token_hex(3)}"
    assert asyncio.run(_choices(cluster, auto_release, node, pod)) == ("devicePlugin", "devicePlugin")
    (on_node,) = _fallback_events(cluster, "default", node)
    assert (on_node["type"], on_node["involvedObject"]["kind"]) == ("Warning", "Node")
    assert "allowMultipleAllocations" in on_node["message"] and FEATURE_GATE in on_node["message"]
    (on_pod,) = _fallback_events(cluster, RELEASE_NS, pod)
    assert (on_pod["type"], on_pod["involvedObject"]["kind"]) == ("Warning", "Pod")
    assert "capacity.requests" in on_pod["message"] and FEATURE_GATE in on_pod["message"]
    # nothing was created by the probes
    assert not (cluster.get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items")
    templates = cluster.get(f"/apis/resource.k8s.io/v1/namespaces/{RELEASE_NS}/resourceclaimtemplates")
    assert not (templates or {}).get("items")


def test_the_agent_process_with_auto_runs_the_device_plugin_when_the_gate_is_off(
    gate_off: ControlPlane, auto_release: list[dict[str, Any]]
) -> None:
    """`tessera-agent` as the chart runs it with auto (both paths' directories), under its ServiceAccount: it
    registers as the device plugin, publishes no ResourceSlice and opens no DRA socket."""
    cluster = gate_off
    node = f"auto-agent-{secrets.token_hex(3)}"
    status, body = cluster.request("POST", "/api/v1/nodes", {"metadata": {"name": node}})
    assert status == 201, body
    clients = _clients(
        cluster, auto_release
    )  # the RBAC applied; the kubeconfig files are what the agent reads
    asyncio.run(_close(clients))
    kubeconfig = cluster.workdir / "agent-auto.kubeconfig"
    state = Path(tempfile.mkdtemp(prefix="auto-", dir="/tmp"))  # short: unix socket paths
    argv = [
        str(Path(sys.executable).parent / "tessera-agent"), f"--node={node}", "--lanes-api=auto",
        "--fake-gpu-backend=1", "--no-mps", "--metrics-port=0", "--no-lane-audit",
        f"--kubelet-plugins-dir={state / 'plugins'}", f"--kubelet-registry-dir={state / 'reg'}",
        f"--cdi-dir={state / 'cdi'}", f"--mps-root={state / 'mps'}", f"--dev-root={state / 'dev'}",
        f"--device-plugin-dir={state / 'dp'}", "-v",
    ]  # fmt: skip
    (state / "dp").mkdir()
    proc = cluster.spawn(f"auto-agent-{node}", argv, {**os.environ, "KUBECONFIG": str(kubeconfig)})
    try:
        wait_until(
            lambda: (state / "dp" / contract.AGENT_SOCKET_NAME).exists(),
            90,
            "the device plugin's socket",
            proc,
        )
        log = proc.log.read_text()
        assert "running the device plugin, not DRA lanes" in log and FEATURE_GATE in log, log
        (event,) = _fallback_events(cluster, "default", node)
        assert event["involvedObject"]["kind"] == "Node"
        assert not (state / "plugins").exists() or not any((state / "plugins").rglob("*.sock"))
        assert not (cluster.get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items")
    finally:
        proc.stop()
        cluster.request("DELETE", f"/api/v1/nodes/{node}")
        shutil.rmtree(state, ignore_errors=True)


async def _close(clients: dict[str, KubeClient]) -> None:
    for c in clients.values():
        await c.close()
