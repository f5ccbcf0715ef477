"""Fixtures for the real-cluster tests: one control plane per session, a namespace per test, GPU nodes.

The control plane is real (see controlplane.py); only the kubelet is missing, so tests create Node objects
the way the node agent would publish them and play the kubelet's part on pods (status patches). Without
the binaries the tests skip with the reason — except under CI=true, where a missing binary fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import Controller, make_registry

from tests.integration.clock import ManualClock
from tests.ports import free_port
from tests.requires import missing

from .admin_cli import AdminCLI, find_cli
from .controlplane import ROOT, ControlPlane, NoBinaries, Process, control_plane, wait_until


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    try:
        plane = control_plane()
        cp = plane.__enter__()
    except NoBinaries as err:
        missing(f"no Kubernetes control plane: {err}")
    try:
        yield cp
    finally:
        plane.__exit__(None, None, None)


@pytest.fixture(scope="session")
def admin_cli(cluster: ControlPlane) -> AdminCLI:
    """The Helm 4 CLI and kubectl (hack/cli-assets.sh) as cluster-admin, run from the repository root."""
    try:
        path = find_cli()
    except NoBinaries as err:
        missing(f"no Helm CLI: {err}")
    return AdminCLI(path, cluster.kubeconfig, cluster.workdir / "helm-home")


def apply_crds(cluster: ControlPlane) -> ControlPlane:
    """The chart's CRDs applied the way the README tells users to (server-side apply), and Established."""
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "charts" / "tessera" / "crds"))
    for plural in (
        contract.PLURAL_APP,
        contract.PLURAL_TRIALGROUP,
        contract.PLURAL_MODELDEPLOYMENT,
        contract.PLURAL_QUEUE,
    ):
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.{contract.GROUP}"
        )
    return cluster


@pytest.fixture(scope="session")
def crds(cluster: ControlPlane) -> ControlPlane:
    return apply_crds(cluster)


@pytest.fixture
def namespace(cluster: ControlPlane) -> Iterator[str]:
    """A fresh namespace, ready for pods (its `default` ServiceAccount exists); deleted afterwards."""
    name = f"t-{secrets.token_hex(4)}"
    status, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    wait_until(
        lambda: cluster.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount of {name}",
    )
    yield name
    delete_namespace(cluster, name)


TESSERA_PLURALS = (contract.PLURAL_APP, contract.PLURAL_TRIALGROUP, contract.PLURAL_MODELDEPLOYMENT)


def delete_namespace(cluster: ControlPlane, name: str) -> None:
    """Delete a test's namespace without leaving its Tessera objects to the next test's operator.

    The test's operator has stopped, so its finalizers on objects the test did not delete would hold them
    (and the namespace, Terminating) until another operator came by: the next test's, watching the whole
    cluster, which then admitted such an App and leased it GPUs of its own test's node before the
    namespace controller got to delete it (a CI-like run: a TrialGroup's pod never bound). So they are
    deleted and their finalizers taken off here, as an admin would with no operator running."""
    for plural in TESSERA_PLURALS:
        path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{name}/{plural}"
        for obj in (cluster.get(path) or {}).get("items") or []:
            item = f"{path}/{obj['metadata']['name']}"
            cluster.request("DELETE", item)
            cluster.request(
                "PATCH",
                item,
                {"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")


def gpu_node_body(
    name: str, gpus: int, memory_mib: int = 16384, model: str = "V100", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    inv = [GpuInfo(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=memory_mib) for i in range(gpus)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)},
        },
    }


def node_status(gpus: int, slots_per_gpu: int = 1) -> dict[str, Any]:
    """What a kubelet with the node agent reports: Ready, CPU/memory/pods, and the agent's GPU slots."""
    capacity = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "250",
        contract.RESOURCE_GPU: str(gpus * slots_per_gpu),
    }
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "played by the test",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    }


class Nodes:
    """Creates Ready GPU nodes and deletes them when the test ends (nodes are cluster-wide)."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.names: list[str] = []

    def add(self, name: str, gpus: int, *, slots_per_gpu: int = 1, **kw: Any) -> str:
        status, body = self.cluster.request("POST", "/api/v1/nodes", gpu_node_body(name, gpus, **kw))
        assert status == 201, body
        self.names.append(name)
        status, body = self.cluster.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            node_status(gpus, slots_per_gpu),
            content_type="application/merge-patch+json",
        )
        assert status == 200, body
        # The API server's TaintNodesByCondition admission taints a new node not-ready; the node lifecycle
        # controller (off here: no kubelet heartbeats) lifts it once the node is Ready, so the test does.
        status, body = self.cluster.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": None}},
            content_type="application/merge-patch+json",
        )
        assert status == 200, body
        return name

    def cleanup(self) -> None:
        for name in self.names:
            with contextlib.suppress(Exception):
                self.cluster.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture
def nodes(cluster: ControlPlane) -> Iterator[Nodes]:
    made = Nodes(cluster)
    yield made
    made.cleanup()


def set_pod_phase(cluster: ControlPlane, namespace: str, name: str, phase: str) -> None:
    """Play the kubelet: move a pod's phase through the status subresource."""
    status, body = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"phase": phase}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, json.dumps(body)[:500]


# --- GPU nodes reserved (chart value gpuNodes.reserve) -------------------------------------------------------

GPU_NODES_POLICY_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def gpu_nodes_policy_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's MutatingAdmissionPolicy and binding for gpuNodes.reserve (real Helm engine)."""
    objs = chart_objects({"gpuNodes": {"reserve": True, **(values or {})}})
    return [o for o in objs if o["kind"] in GPU_NODES_POLICY_KINDS and _component(o) == "gpu-nodes"]


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"].get("app.kubernetes.io/component", ""))


def queue_admission_objects() -> list[dict[str, Any]]:
    """The chart's MutatingAdmissionPolicy and binding that gate pods in queues (default values)."""
    objs = chart_objects()
    return [o for o in objs if o["kind"] in GPU_NODES_POLICY_KINDS and _component(o) == "queue-admission"]


def routed_to_tessera(pod: dict[str, Any]) -> bool:
    spec = pod["spec"]
    toleration = contract.gpu_node_toleration()
    return bool(
        spec["schedulerName"] == contract.SCHEDULER_NAME and toleration in spec.get("tolerations", [])
    )


@pytest.fixture(scope="module")
def gpu_nodes_policy(cluster: ControlPlane) -> Iterator[list[dict[str, Any]]]:
    """The chart's namespace routing applied as rendered; ready once the API server enforces it (policies
    load through an informer, so the first pods after the apply may pass unchanged); removed afterwards."""
    objs = gpu_nodes_policy_objects()
    manifest = "\n---\n".join(yaml.safe_dump(o) for o in objs)
    applied = cluster.kubectl("apply", "-f", "-", stdin=manifest, check=False)
    assert applied.returncode == 0, applied.stderr
    probe = f"probe-{secrets.token_hex(4)}"
    labels = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}
    status, body = cluster.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": probe, "labels": labels}}
    )
    assert status == 201, body
    pod = {"metadata": {"name": "probe"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}

    def enforced() -> bool:
        status, out = cluster.request("POST", f"/api/v1/namespaces/{probe}/pods?dryRun=All", pod)
        return status == 201 and routed_to_tessera(out)

    try:
        wait_until(enforced, 120, "the chart's MutatingAdmissionPolicy to take effect")
        yield objs
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{probe}")
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifest)


# --- Tessera's components under the chart's own ServiceAccounts -------------------------------------------

RELEASE_NS = "tessera-system"
# The `tessera` console script of the environment running the tests (not whatever is first on PATH).
TESSERA = Path(sys.executable).with_name("tessera")
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@dataclass
class Credentials:
    """A component's identity: the chart's ServiceAccount, a TokenRequest token, a kubeconfig with it."""

    service_account: str
    token: str
    kubeconfig: Path


def chart_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    from tests.unit.chart.chart_render import objects, render

    return objects(render(values))


def request_token(cluster: ControlPlane, namespace: str, service_account: str) -> str:
    """A bound token from the TokenRequest API, as the kubelet would mount for the pod."""
    status, body = cluster.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        },
    )
    assert status == 201, body
    return str(body["status"]["token"])


@pytest.fixture(scope="session")
def chart_rbac(crds: ControlPlane) -> dict[str, Credentials]:
    """The chart's ServiceAccounts and RBAC (default values) applied; component → its credentials.

    Components in these tests run with these tokens, never as cluster-admin, so a permission the chart
    forgot fails the test that needs it."""
    return apply_chart_rbac(crds)


def apply_chart_rbac(cluster: ControlPlane) -> dict[str, Credentials]:
    """What the `chart_rbac` fixture sets up, for callers outside pytest (benchmarks)."""
    cluster.kubectl("create", "namespace", RELEASE_NS, check=False)
    docs = [o for o in chart_objects() if o["kind"] in RBAC_KINDS]
    cluster.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
    out = {}
    for doc in docs:
        if doc["kind"] != "ServiceAccount":
            continue
        sa = doc["metadata"]["name"]
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        token = request_token(cluster, RELEASE_NS, sa)
        path = cluster.write_kubeconfig(cluster.workdir / f"{component}.kubeconfig", token=token)
        out[component] = Credentials(sa, token, path)
    return out


@dataclass
class Scheduling:
    """`tessera extender` and kube-scheduler (with the shipped KubeSchedulerConfiguration) as processes."""

    extender_url: str
    metrics_url: str
    extender: Process
    scheduler: Process
    scheduler_metrics_url: str = ""  # kube-scheduler's own /metrics (HTTPS, self-signed, no token needed)
    # Where the API server's audit log ended when these started: their requests are the ones after it (the
    # chart's scheduler account is the session's, and earlier tests ran extenders under it too).
    audit_offset: int = 0


def _extender_healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
        return bool(resp.status == 200)


def _scheduler_config(
    cluster: ControlPlane, extender_url: str, kubeconfig: Path, overrides: dict[str, Any] | None = None
) -> Path:
    config = yaml.safe_load((ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text())
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config.update(overrides or {})
    for ext in config["extenders"]:
        ext["urlPrefix"] = extender_url
    path = cluster.workdir / f"scheduler-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def run_scheduling(
    cluster: ControlPlane,
    creds: Credentials,
    extender_args: tuple[str, ...] = (),
    scheduler_config: dict[str, Any] | None = None,
) -> Iterator[Scheduling]:
    """`tessera extender` (with `extender_args`) and tessera-scheduler, as the chart's `scheduler` account;
    `scheduler_config` replaces top-level fields of its KubeSchedulerConfiguration."""
    port, metrics_port, sched_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    audit_offset = cluster.audit_offset()
    ext = cluster.spawn(
        f"extender-{port}",
        [str(TESSERA),
         "extender", "--kubeconfig", str(creds.kubeconfig), "--host", "127.0.0.1", "--port", str(port),
         "--metrics-port", str(metrics_port), *extender_args],
    )  # fmt: skip
    sched = cluster.spawn(
        f"kube-scheduler-{port}",
        [str(cluster.assets / "kube-scheduler"),
         f"--config={_scheduler_config(cluster, url, creds.kubeconfig, scheduler_config)}",
         "--bind-address=127.0.0.1", f"--secure-port={sched_port}", "-v=2",
         "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"],
    )  # fmt: skip
    try:
        wait_until(lambda: _extender_healthy(url), 60, "the extender's /healthz", ext)
        wait_until(
            lambda: "Starting Kubernetes Scheduler" in sched.log.read_text(), 60, "kube-scheduler", sched
        )
        yield Scheduling(
            url,
            f"http://127.0.0.1:{metrics_port}/metrics",
            ext,
            sched,
            f"https://127.0.0.1:{sched_port}/metrics",
            audit_offset,
        )
    finally:
        sched.stop()
        ext.stop()


@pytest.fixture(scope="module")
def scheduling(cluster: ControlPlane, chart_rbac: dict[str, Credentials]) -> Iterator[Scheduling]:
    """The extender and tessera-scheduler, both as the chart's `scheduler` ServiceAccount.

    These nodes have no kubelet: nothing ever calls Allocate, so no bound pod would be marked allocated and
    hand its node on; the extender runs without the handoff here. The handoff runs on the real node
    (tests/integration/node) and in test_handoff.py, where the test marks pods as the agent does."""
    with run_scheduling(cluster, chart_rbac["scheduler"], ("--no-allocate-handoff",)) as started:
        yield started


# --- the operator, in-process, as the chart's `operator` ServiceAccount -----------------------------------


@contextlib.asynccontextmanager
async def running_operator(
    cluster: ControlPlane,
    creds: Credentials,
    *,
    identity: str | None = None,
    stop_timeout: float = 30.0,
    **overrides: Any,
) -> AsyncIterator[Controller]:
    """The real kopf operator against the real API server, with the operator's token and the server's CA.

    `overrides` are OperatorConfig fields; leases run on a ManualClock unless a test passes `clock=`.
    `stop_timeout`: how long kopf may take to stop (benchmarks with thousands of objects' timers give it
    longer)."""
    settings: dict[str, Any] = {"lease_s": 1.0, "tick_s": 0.1, "standalone": True, "preemption_grace_s": 5}
    settings.update(overrides)
    settings.setdefault("clock", ManualClock())
    config = OperatorConfig(**settings)
    conn = kopf.ConnectionInfo(server=cluster.server, token=creds.token, ca_path=str(cluster.ca_file))
    registry, ctl = make_registry(config, conn)
    stop = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            clusterwide=config.clusterwide,
            namespaces=list(config.namespaces),
            stop_flag=stop,
            standalone=config.standalone,
            priority=config.priority,
            peering_name=config.peering_name if not config.standalone else None,
            identity=identity,  # type: ignore[arg-type]  # kopf types it as a NewType of str
        )
    )
    try:
        yield ctl
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=stop_timeout)


async def wait_for(
    check: Callable[[], Any],
    timeout: float = 90.0,
    what: str = "condition",
    explain: Callable[[], str] | None = None,
) -> Any:
    """Async poll of `check` until truthy (the deadline bounds failure only; a pass returns at once). On a
    timeout the failure carries `explain()`: what the cluster looked like, for a wait that failed in CI."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        if time.monotonic() > deadline:
            detail = f"\n{await asyncio.to_thread(explain)}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        await asyncio.sleep(0.1)
