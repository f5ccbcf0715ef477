"""DRA lanes on the real node (issue 30): the agent as the DRA driver `gpu.tessera.io` beside the real kubelet,
kube-scheduler and containerd 2.x with CDI, no extender.

The agent runs as a host process (`tessera-agent --lanes-api dra --fake-gpu-backend 1`, one fake A100 of
40 GiB behind the NVML interface, 40448 MiB usable), registered through the kubelet's plugin directory; pods
ask for lanes with ResourceClaimTemplates, the default kube-scheduler allocates them from the agent's
ResourceSlice (consumable capacity), and the kubelet asks the agent to prepare each claim before starting the
container, which sees the lane through the CDI device the agent wrote. Each claim's MPS daemon is the fake
control binary's (`tessera-fake-mps-control`) offering MPS v3, so each claim's lane is a namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tessera.api import contract
from tessera_agent.enforce import mps_v3
from tessera_agent.kubelet.dra_plugin import HOLD_PREPARE_ENV
from tessera_agent.kubelet.dra_slice import device_class

from tests.integration.k8s.controlplane import Process, wait_until

from . import adversary
from .node import Node

RESOURCE_API = "/apis/resource.k8s.io/v1"
DEADLINE_S = 180
# The chart's agent (test_chart_on_node.py) uses the same fake GPU UUIDs; this one owns only the DRA sockets.
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


class Agent:
    """The agent process on the node's host, restartable with the same arguments."""

    def __init__(self, node: Node) -> None:
        self.node = node
        root = node.kubelet_root
        self.state = node.workdir / "dra-agent"
        self.hold = self.state / "hold-prepare"
        # Each claim's MPS v3 daemon, the fake control binary's: a short root, for the kernel's 108-byte limit
        # on the socket paths under it.
        self.mps = Path(tempfile.mkdtemp(prefix="tm-"))
        self.argv = [
            str(Path(sys.executable).parent / "tessera-agent"),
            f"--node={node.name}",
            "--lanes-api=dra",
            "--fake-gpu-backend=1",
            f"--mps-binary={Path(sys.executable).parent / 'tessera-fake-mps-control'}",
            "--hp-be-lanes",  # a claim's LaneConfig class; claims without one are best-effort
            "--metrics-port=0",
            "--sample-interval=5",
            f"--kubelet-plugins-dir={root / 'plugins'}",
            f"--kubelet-registry-dir={root / 'plugins_registry'}",
            f"--cdi-dir={node.cdi_dir}",
            f"--mps-root={self.mps}",
            f"--dev-root={self.state / 'fake-dev'}",  # fake device nodes, which the claims' CDI specs name
            "-v",
        ]
        self.env = {
            **os.environ,
            "KUBECONFIG": str(node.plane.kubeconfig),
            HOLD_PREPARE_ENV: str(self.hold),
            "FAKE_MPS_PROTOCOLS": "2,3",  # a driver with MPS v3: the agent's auto picks namespaces
        }
        self.starts = 0
        self.proc: Process | None = None

    def start(self) -> None:
        self.starts += 1
        self.proc = self.node.plane.spawn(f"dra-agent-{self.starts}", self.argv, self.env)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.popen.pid, signal.SIGKILL)
        self.proc.popen.wait(30)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    @property
    def checkpoint(self) -> dict[str, Any]:
        path = self.node.kubelet_root / "plugins" / contract.DRA_DRIVER / "checkpoint.json"
        try:
            return dict(json.loads(path.read_text())["claims"])
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


@pytest.fixture(scope="module")
def agent(node: Node) -> Iterator[Agent]:
    if node.containerd_dir is None:
        pytest.fail("DRA needs CDI: run the node with the built containerd (TESSERA_NODE_CONTAINERD=built)")
    status, body = node.plane.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    assert status in (201, 409), body
    a = Agent(node)
    a.start()
    try:
        wait_until(lambda: published_slice(node) is not None, DEADLINE_S, "the agent's ResourceSlice", a.proc)
        yield a
    finally:
        a.stop()
        shutil.rmtree(a.mps, ignore_errors=True)  # a daemon whose socket goes exits
        node.plane.request("DELETE", f"{RESOURCE_API}/resourceslices/{node.name}-{contract.DRA_DRIVER}")
        node.plane.request("DELETE", f"{RESOURCE_API}/deviceclasses/{contract.DRA_DEVICE_CLASS}")


def published_slice(node: Node) -> dict[str, Any] | None:
    got = node.plane.get(f"{RESOURCE_API}/resourceslices/{node.name}-{contract.DRA_DRIVER}")
    return got if isinstance(got, dict) and got.get("spec") else None


def lane_template(
    node: Node, namespace: str, name: str, memory: str, compute: str, lane_class: str | None = None
) -> None:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": contract.DRA_DEVICE_CLASS,
                                "capacity": {"requests": {"memory": memory, "computeShare": compute}},
                            },
                        }
                    ]
                }
            }
        },
    }
    if lane_class is not None:
        params = {"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "LaneConfig", "class": lane_class}
        body["spec"]["spec"]["devices"]["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": contract.DRA_DRIVER, "parameters": params}}
        ]
    status, got = node.plane.request(
        "POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates", body
    )
    assert status == 201, got


SHOW_LANE = (
    "import os, sys, time\n"
    "keys = sorted(k for k in os.environ if k.startswith(('CUDA_', 'NVIDIA_', 'TESSERA_')))\n"
    "print('\\n'.join(f'{k}={os.environ[k]}' for k in keys))\n"
    "print('pipe-mounted=' + str(os.path.isdir('/mps/pipe')))\n"
    "sys.stdout.flush()\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def bound(node: Node, namespace: str, name: str) -> bool:
    return bool(pod(node, namespace, name).get("spec", {}).get("nodeName"))


def lane_pods_one_at_a_time(
    node: Node, namespace: str, names: str | list[str], template: str | list[str]
) -> None:
    """Lane pods (sleeping), each created once the one before is bound. kube-scheduler 1.37.2 counts a claim
    twice while it is allocated and still in flight (tests/integration/k8s/test_scheduler_inflight_capacity.py):
    a pod filtered in that window finds the GPU fuller than it is and can wait for the 5-minute flush of
    unschedulable pods, which these tests' deadlines do not cover. Binding comes after the window closes."""
    templates = [template] * len(names) if isinstance(template, str) else template
    for name, of in zip(names, templates, strict=True):
        lane_pod(node, namespace, name, of, sleep_s=3600)
        try:
            wait_until(lambda n=name: bound(node, namespace, n), DEADLINE_S, f"{name} to be bound")
        except TimeoutError:
            raise AssertionError(describe(node, namespace)) from None


def lane_pod(node: Node, namespace: str, name: str, template: str, sleep_s: float = 0) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "lane", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": node.images["TESSERA_IMAGE"],
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", SHOW_LANE, str(sleep_s)],
                    "resources": {"claims": [{"name": "lane"}]},
                }
            ],
        },
    }
    status, got = node.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    assert status == 201, got


def pod(node: Node, namespace: str, name: str) -> dict[str, Any]:
    got = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert isinstance(got, dict), got
    return got


def phase(node: Node, namespace: str, name: str) -> str:
    return str(pod(node, namespace, name).get("status", {}).get("phase", ""))


def pod_claim(node: Node, namespace: str, name: str) -> dict[str, Any] | None:
    statuses = pod(node, namespace, name).get("status", {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    got = node.plane.get(
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    return got if isinstance(got, dict) and got.get("metadata") else None


def lane_env(node: Node, namespace: str, name: str) -> dict[str, str]:
    status, text = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
    assert status == 200, text
    return dict(line.split("=", 1) for line in str(text).splitlines() if "=" in line)


def logged(node: Node, namespace: str, name: str) -> bool:
    status, text = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
    return status == 200 and "pipe-mounted=" in str(text)


def describe(node: Node, namespace: str | None = None) -> str:
    """What a failed wait needs to be explained: the namespace's events, every claim in the cluster with what
    it holds and for whom, the pods outside kube-system, and kube-scheduler's lines on the namespace's pods."""
    lines: list[str] = []
    if namespace is not None:
        events = node.plane.get(f"/api/v1/namespaces/{namespace}/events")
        items = events.get("items", []) if isinstance(events, dict) else []
        lines += [f"{e['involvedObject']['name']}: {e['reason']}: {e.get('message', '')}" for e in items]
    claims = node.plane.get(f"{RESOURCE_API}/resourceclaims")
    lines.append("claims:")
    for c in claims.get("items", []) if isinstance(claims, dict) else []:
        meta, status = c["metadata"], c.get("status", {})
        results = (status.get("allocation") or {}).get("devices", {}).get("results", [])
        held = [
            f"{r['device']}{' admin' if r.get('adminAccess') else ''} {r.get('consumedCapacity', {})}"
            for r in results
        ]
        users = [r["name"] for r in status.get("reservedFor", [])]
        gone = " deleting" if meta.get("deletionTimestamp") else ""
        lines.append(f"  {meta['namespace']}/{meta['name']}{gone}: holds {held or 'nothing'} for {users}")
    pods = node.plane.get("/api/v1/pods")
    lines.append("pods:")
    for p in pods.get("items", []) if isinstance(pods, dict) else []:
        meta = p["metadata"]
        if meta["namespace"] != "kube-system":
            gone = " deleting" if meta.get("deletionTimestamp") else ""
            lines.append(f"  {meta['namespace']}/{meta['name']}{gone}: {p.get('status', {}).get('phase')}")
    scheduler = node.processes.get("kube-scheduler")
    if scheduler is not None and namespace is not None:
        said = [line for line in scheduler.tail(2000).splitlines() if f"{namespace}/" in line]
        lines += ["kube-scheduler:", *said[-20:]]
    return "\n".join(lines)


def allocated_claims(node: Node) -> list[str]:
    """The claims anywhere in the cluster that hold a share of this node's GPUs (an observer's holds none)."""
    got = node.plane.get(f"{RESOURCE_API}/resourceclaims")
    held = []
    for c in got.get("items", []) if isinstance(got, dict) else []:
        results = ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        if any(r["pool"] == node.name and not r.get("adminAccess") for r in results):
            held.append(f"{c['metadata']['namespace']}/{c['metadata']['name']}")
    return held


@pytest.fixture(autouse=True)
def gpu_unallocated(node: Node) -> None:
    """Each test counts the GPU's capacity from nothing held. Earlier tests' pods end with their namespaces,
    or are deleted without waiting, and a claim is deallocated only once its pod has stopped: a test that
    fills the GPU would otherwise depend on how fast the last one's pods went."""
    try:
        wait_until(lambda: not allocated_claims(node), DEADLINE_S, "earlier tests' claims deallocated")
    except TimeoutError:
        raise AssertionError(f"the GPU is still held:\n{describe(node)}") from None


def cdi_specs(node: Node, *uids: str) -> list[str]:
    """The CDI spec files on the node (of these claims only, when given)."""
    names = sorted(p.name for p in node.cdi_dir.glob("*.json"))
    return [n for n in names if not uids or any(u in n for u in uids)]


def claims_of(agent: Agent, namespace: str) -> list[str]:
    """UIDs of the claims of `namespace` in the agent's checkpoint."""
    return [uid for uid, c in agent.checkpoint.items() if c["namespace"] == namespace]


def test_slice_publishes_the_gpu_with_consumable_capacity(node: Node, agent: Agent) -> None:
    s = published_slice(node)
    assert s is not None
    (dev,) = s["spec"]["devices"]
    assert dev["allowMultipleAllocations"] is True
    assert dev["attributes"]["uuid"] == {"string": GPU0}
    assert dev["capacity"]["memory"]["value"] == "40448Mi"
    assert dev["capacity"]["computeShare"]["requestPolicy"]["validRange"]["step"] == "1"


def test_a_claim_of_30_percent_and_10gi_runs_with_that_lanes_env(
    node: Node, namespace: str, agent: Agent
) -> None:
    lane_template(node, namespace, "lane-30", "10Gi", "30")
    lane_pod(node, namespace, "one", "lane-30", sleep_s=3600)
    try:
        wait_until(
            lambda: phase(node, namespace, "one") == "Running" and logged(node, namespace, "one"),
            DEADLINE_S,
            "the lane pod to run",
        )
    except TimeoutError:
        raise AssertionError(describe(node, namespace)) from None
    # The claim lives as long as the pod: the resource claim controller deletes it once the pod is done.
    claim = pod_claim(node, namespace, "one")
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (contract.DRA_DRIVER, node.name, "gpu-0")
    assert result["consumedCapacity"] == {"memory": "10Gi", "computeShare": "30", "clients": "1"}
    env = lane_env(node, namespace, "one")
    assert env["CUDA_VISIBLE_DEVICES"] == GPU0
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/pipe"
    uid = claim["metadata"]["uid"]
    assert env["TESSERA_LANE_ID"] == uid
    assert env["pipe-mounted"] == "True"
    assert agent.checkpoint[uid]["state"] == "prepared" and cdi_specs(node, uid)

    status, got = node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/one")
    assert status == 200, got
    wait_until(
        lambda: uid not in agent.checkpoint and not cdi_specs(node, uid), DEADLINE_S, "the claim unprepared"
    )
    wait_until(lambda: pod_claim_gone(node, namespace, claim), DEADLINE_S, "the claim deleted with its pod")


def test_a_tenant_cannot_reach_another_claims_socket_pipe_shm_or_gpu(
    node: Node, namespace: str, agent: Agent
) -> None:
    """Issue 39, DRA mode: two claims on the one GPU; from inside its container the prober finds no other
    claim's MPS socket, writes only into its own claim's pipe directory, cannot read its neighbour's /dev/shm,
    and has exactly its GPU's device node from the CDI spec (tests/integration/node/adversary.py)."""
    lane_template(node, namespace, "lane-10", "2Gi", "10")
    claims = {"resourceClaims": [{"name": "lane", "resourceClaimTemplateName": "lane-10"}]}
    uses = {"container": {"resources": {"claims": [{"name": "lane"}]}}}
    for name, script in (("neighbour", adversary.NEIGHBOUR), ("prober", adversary.prober_script(2))):
        body = adversary.pod(node, name, script, {**claims, **uses})
        status, got = node.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        assert status == 201, got
        if name == "neighbour":
            try:
                wait_until(
                    lambda: "READY" in log_of(node, namespace, "neighbour"), DEADLINE_S, "the neighbour"
                )
            except TimeoutError:
                raise AssertionError(describe(node, namespace)) from None
    seen = wait_until(
        lambda: adversary.probe_result(log_of(node, namespace, "prober")), DEADLINE_S, "the prober's report"
    )
    assert adversary.check_probe(seen, 0, 2) == [], json.dumps(seen)  # the node's one fake GPU is minor 0
    claim = pod_claim(node, namespace, "prober")
    assert claim is not None
    uid = claim["metadata"]["uid"]
    namespace_dir = agent.mps / "lanes" / uid / "pipe" / "tessera" / mps_v3.namespace_name(uid)
    assert (namespace_dir / "probe-a").exists()  # its container's pipe directory is its v3 namespace's
    assert not (agent.mps / "pipe").exists() and not (agent.mps / "shm").exists()
    # (d) Its env said 100 % and 40 GiB; its claim's namespace still holds the lane's 10 % and 2 GiB.
    assert seen["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10" and seen["raised"] == 0, seen["env"]
    held = adversary.held_limits(agent.mps / "lanes" / uid / "pipe", "v3", mps_v3.namespace_name(uid))
    assert held == {"pinned-memory-limit": "2048M", "active-thread-percentage": "10"}, held


def log_of(node: Node, namespace: str, name: str) -> str:
    status, text = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
    return str(text) if status == 200 else ""


def test_an_hp_claim_runs_with_all_threads_at_normal_priority_beside_a_be_one(
    node: Node, namespace: str, agent: Agent
) -> None:
    """Issue 39: HP and BE lanes keyed by claim, from the claim's LaneConfig, through the real allocator,
    kubelet and containerd (CDI)."""
    lane_template(node, namespace, "hp", "4Gi", "40", lane_class="latency-critical")
    lane_template(node, namespace, "be", "4Gi", "60")  # with the HP claim's 40: the whole GPU
    lane_pods_one_at_a_time(node, namespace, ["serve", "train"], ["hp", "be"])
    try:
        wait_until(
            lambda: all(logged(node, namespace, p) for p in ("serve", "train")),
            DEADLINE_S,
            "both lanes to run",
        )
    except TimeoutError:
        raise AssertionError(describe(node, namespace)) from None
    hp, be = lane_env(node, namespace, "serve"), lane_env(node, namespace, "train")
    assert (hp["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], hp["CUDA_MPS_CLIENT_PRIORITY"]) == ("100", "0"), hp
    assert (be["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], be["CUDA_MPS_CLIENT_PRIORITY"]) == ("50", "1"), be
    for name in ("serve", "train"):
        node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")


def claim_template(node: Node, namespace: str, name: str, requests: list[dict[str, Any]]) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }
    status, got = node.plane.request(
        "POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates", body
    )
    assert status == 201, got


def gpu_request(name: str, capacity: dict[str, str] | None = None, admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": contract.DRA_DEVICE_CLASS}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    if admin:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def test_two_requests_of_one_claim_on_the_gpu_run_with_their_sum(
    node: Node, namespace: str, agent: Agent
) -> None:
    """Issue 40: the allocator puts both requests on the node's one GPU, two shares charged separately; the
    container's lane is their sum, and the pod runs (each share its own CDI device: a spec naming one device
    twice is dropped by containerd's CDI cache, and the container with it)."""
    share = {"memory": "10Gi", "computeShare": "20"}  # 40 % in all: under the BE cap of 50 % of this node
    claim_template(node, namespace, "pair", [gpu_request("a", share), gpu_request("b", share)])
    lane_pod(node, namespace, "pair", "pair", sleep_s=3600)
    try:
        wait_until(
            lambda: phase(node, namespace, "pair") == "Running" and logged(node, namespace, "pair"),
            DEADLINE_S,
            "the two-request pod to run",
        )
    except TimeoutError:
        raise AssertionError(describe(node, namespace)) from None
    claim = pod_claim(node, namespace, "pair")
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in results] == [("a", "gpu-0"), ("b", "gpu-0")]
    assert all(r["consumedCapacity"] == {**share, "clients": "1"} for r in results)
    assert len({r["shareID"] for r in results}) == 2
    env = lane_env(node, namespace, "pair")
    assert env["CUDA_VISIBLE_DEVICES"] == GPU0
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M", env
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40", env
    uid = claim["metadata"]["uid"]
    assert agent.checkpoint[uid]["limits"] == {GPU0: [20480, 40]}
    node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/pair")
    wait_until(
        lambda: uid not in agent.checkpoint and not cdi_specs(node, uid), DEADLINE_S, "the claim unprepared"
    )


def unschedulable(node: Node, namespace: str, name: str) -> str | None:
    conds = {c["type"]: c for c in pod(node, namespace, name).get("status", {}).get("conditions", [])}
    cond = conds.get("PodScheduled")
    if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
        return str(cond.get("message", ""))
    return None


def test_an_admin_access_claim_observes_the_gpu_and_is_charged_nothing(
    node: Node, namespace: str, agent: Agent
) -> None:
    """Issue 40: a monitoring pod's admin-access claim (DRAAdminAccess, GA and locked on in 1.37; the namespace
    labelled for it) sees the GPU beside a lane and holds no lane of its own: no MPS env or pipe, nothing in
    the agent's lane book, and the allocator leaves its share uncounted (a 30 % and a 70 % lane fit beside it).
    """
    status, got = node.plane.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, got
    lane_template(node, namespace, "lane-30", "4Gi", "30")
    lane_pod(node, namespace, "train", "lane-30", sleep_s=3600)
    wait_until(lambda: logged(node, namespace, "train"), DEADLINE_S, "the 30 % lane to run")

    # Named no capacity, the admin request asks for the defaults (the whole GPU), which the allocator checks
    # against what the lanes hold even though it will count none of it: Pending beside any lane.
    claim_template(node, namespace, "watch-all", [gpu_request("gpu", admin=True)])
    lane_pod(node, namespace, "watch-all", "watch-all")
    message = wait_until(
        lambda: unschedulable(node, namespace, "watch-all"), DEADLINE_S, "the whole-GPU admin"
    )
    assert "cannot allocate all claims" in message, message
    node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/watch-all")

    # Asking the least there is, it is allocated beside the lane and runs as an observer.
    least = {"memory": "1Mi", "computeShare": "1"}
    claim_template(node, namespace, "watch", [gpu_request("gpu", least, admin=True)])
    lane_pod(node, namespace, "watch", "watch", sleep_s=3600)
    try:
        wait_until(lambda: logged(node, namespace, "watch"), DEADLINE_S, "the observer to run")
    except TimeoutError:
        raise AssertionError(describe(node, namespace)) from None
    claim = pod_claim(node, namespace, "watch")
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["device"], result["adminAccess"]) == ("gpu-0", True)
    env = lane_env(node, namespace, "watch")
    assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"], env["pipe-mounted"]) == (
        GPU0,
        GPU0,
        "False",
    )
    assert not [k for k in env if k.startswith(("CUDA_MPS_", "TESSERA_"))], env
    uid = claim["metadata"]["uid"]
    assert agent.checkpoint[uid]["observer"] is True and agent.checkpoint[uid]["limits"] == {}
    assert not (agent.mps / "lanes" / uid).exists()

    # 30 % + 70 % is the whole GPU: the 70 % lane fits only if the observer's 1 % is not counted.
    lane_template(node, namespace, "lane-70", "4Gi", "70")
    lane_pod(node, namespace, "serve", "lane-70", sleep_s=0)
    try:
        wait_until(lambda: phase(node, namespace, "serve") == "Succeeded", DEADLINE_S, "the 70 % lane to run")
    except TimeoutError:
        raise AssertionError(describe(node, namespace)) from None
    for name in ("train", "watch", "serve"):
        node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    wait_until(
        lambda: not claims_of(agent, namespace) and not cdi_specs(node, uid),
        DEADLINE_S,
        "the claims unprepared",
    )


def pod_claim_gone(node: Node, namespace: str, claim: dict[str, Any]) -> bool:
    status, _ = node.plane.request(
        "GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{claim['metadata']['name']}"
    )
    return status == 404


def test_three_lanes_share_the_gpu_a_fourth_waits_and_runs_once_one_ends(
    node: Node, namespace: str, agent: Agent
) -> None:
    lane_template(node, namespace, "lane-30", "10Gi", "30")
    lane_pods_one_at_a_time(node, namespace, "abc", "lane-30")
    try:
        wait_until(
            lambda: all(phase(node, namespace, n) == "Running" and logged(node, namespace, n) for n in "abc"),
            DEADLINE_S,
            "three lane pods running at once",
        )
    except TimeoutError:
        raise AssertionError(describe(node, namespace)) from None
    claims = [pod_claim(node, namespace, n) for n in "abc"]
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims if c]
    assert [r["device"] for r in results] == ["gpu-0"] * 3
    assert len({r["shareID"] for r in results}) == 3  # three shares of one device
    uids = [c["metadata"]["uid"] for c in claims if c]
    assert sorted(claims_of(agent, namespace)) == sorted(uids) and len(cdi_specs(node, *uids)) == 3

    lane_pod(node, namespace, "d", "lane-30", sleep_s=0)

    def unschedulable() -> str | None:
        conds = {c["type"]: c for c in pod(node, namespace, "d").get("status", {}).get("conditions", [])}
        cond = conds.get("PodScheduled")
        if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
        return None

    message = wait_until(unschedulable, DEADLINE_S, "the fourth pod to be found unschedulable")
    assert "cannot allocate all claims" in message, message
    assert phase(node, namespace, "d") == "Pending"

    # One pod ends: its claim goes with it (unprepared on the node, deallocated), and the fourth fits.
    status, got = node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/a")
    assert status == 200, got
    wait_until(lambda: phase(node, namespace, "d") == "Succeeded", DEADLINE_S, "the fourth pod to run")
    assert lane_env(node, namespace, "d")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

    for name in ("b", "c", "d"):
        node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    wait_until(
        lambda: not claims_of(agent, namespace) and not cdi_specs(node, *uids),
        DEADLINE_S,
        "every claim unprepared",
    )

    def claims_gone() -> bool:
        got = node.plane.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")
        return isinstance(got, dict) and not got.get("items")

    wait_until(claims_gone, DEADLINE_S, "the pods' claims deleted")


def test_agent_killed_mid_prepare_loses_nothing(node: Node, namespace: str, agent: Agent) -> None:
    lane_template(node, namespace, "lane-20", "4Gi", "20")
    agent.hold.parent.mkdir(parents=True, exist_ok=True)
    agent.hold.write_text("")
    try:
        lane_pod(node, namespace, "held", "lane-20", sleep_s=3600)
        wait_until(
            lambda: any(c["state"] == "preparing" for c in agent.checkpoint.values()),
            DEADLINE_S,
            "the agent to start preparing the claim",
            agent.proc,
        )
        t0 = time.monotonic()
        agent.kill()
    finally:
        agent.hold.unlink(missing_ok=True)
    (uid,) = claims_of(agent, namespace)
    agent.start()
    wait_until(
        lambda: phase(node, namespace, "held") == "Running" and logged(node, namespace, "held"),
        DEADLINE_S,
        "the held pod to run",
    )
    node.timings["recovery: DRA agent killed mid-prepare (pod ran)"] = time.monotonic() - t0
    env = lane_env(node, namespace, "held")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20" and env["TESSERA_LANE_ID"] == uid
    assert agent.checkpoint[uid]["state"] == "prepared"
    node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/held")
    wait_until(
        lambda: uid not in agent.checkpoint and not cdi_specs(node, uid), DEADLINE_S, "the claim unprepared"
    )
