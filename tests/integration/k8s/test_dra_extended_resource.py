"""Pods written for the device plugin (`tessera.io/gpu: N`, no claim) served from DRA lanes (KEP-5004): the
DeviceClass names `extendedResourceName: tessera.io/gpu`, the node advertises no such resource (no device
plugin), and the real kube-scheduler makes the pod a claim of N whole GPUs from the slice the agent's DRA
driver publishes. The driver, run against the same API server with the test as the kubelet, prepares that
claim as any other."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.api.gpu_inventory import dump_node_gpus
from tessera.controller.view import pod_info
from tessera.kube import KubeClient, KubeConfig
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.backend import usable_memory_mib
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.gpus.inventory import node_gpus
from tessera_agent.kubelet.dra_plugin import DraDriver, KubernetesDraApi
from tessera_agent.kubelet.dra_slice import device_class
from tessera_agent.proto import dra_v1_pb2, dra_v1_pb2_grpc

from tests.ports import free_port

from .conftest import Credentials, Nodes, Scheduling, run_scheduling, wait_for
from .controlplane import ControlPlane, Process, default_scheduler, wait_until

RESOURCE_API = "/apis/resource.k8s.io/v1"
CLASS_PATH = f"{RESOURCE_API}/deviceclasses/{contract.DRA_DEVICE_CLASS}"
# resourceapi.ExtendedResourceClaimAnnotation: what marks the claim kube-scheduler made for a pod
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


@pytest.fixture
def scheduler(cluster: ControlPlane) -> Iterator[Process]:
    with default_scheduler(cluster) as proc:
        yield proc


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tsx-", dir="/tmp"))  # unix socket paths are capped at 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


class DraNode:
    def __init__(self, name: str, backend: FakeGpuBackend, cfg: AgentConfig) -> None:
        self.name, self.backend, self.cfg = name, backend, cfg


@contextlib.asynccontextmanager
async def running_dra_node(
    cluster: ControlPlane, nodes: Nodes, sock_dir: Path, gpus: int
) -> AsyncIterator[DraNode]:
    """A node in DRA mode with `gpus` fake 40 GiB GPUs: no tessera.io/gpu in its capacity (no device plugin),
    the agent's inventory annotation for those GPUs, the agent's DRA driver running against the API server
    (publishing the slice, answering the kubelet's calls), and the chart's DeviceClass, extendedResourceName
    included. The class is the test's own: it replaces one left by another test and goes afterwards, so no
    other test sees tessera.io/gpu backed by DRA."""
    backend = FakeGpuBackend.uniform(gpus)
    node = nodes.add(f"dra-er-{secrets.token_hex(3)}", gpus=gpus)
    gone = {contract.RESOURCE_GPU: None}
    status, body = cluster.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"capacity": gone, "allocatable": gone}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body
    inventory = {contract.ANN_NODE_GPUS: dump_node_gpus(node_gpus(backend))}  # as the agent publishes it
    status, body = cluster.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"annotations": inventory}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body
    cluster.request("DELETE", CLASS_PATH)
    await wait_for(lambda: cluster.get(CLASS_PATH) is None, 60, "an earlier DeviceClass gone")
    status, body = cluster.request(
        "POST", f"{RESOURCE_API}/deviceclasses", device_class(contract.RESOURCE_GPU)
    )
    assert status == 201, body
    assert body["spec"]["extendedResourceName"] == contract.RESOURCE_GPU  # kept: DRAExtendedResource is on

    cfg = AgentConfig(
        node_name=node,
        lanes_api="dra",
        slots_per_gpu=4,
        mps_root=sock_dir / "mps",
        kubelet_plugins_dir=sock_dir / "plugins",
        kubelet_registry_dir=sock_dir / "reg",
        cdi_dir=sock_dir / "cdi",
        progress_socket=Path("/run/tessera/progress/progress.sock"),
    )
    api = KubeClient(KubeConfig.from_kubeconfig(cluster.kubeconfig))
    stop = asyncio.Event()
    task = asyncio.create_task(DraDriver(cfg, backend, KubernetesDraApi(api)).run(stop))
    slice_path = f"{RESOURCE_API}/resourceslices/{node}-{contract.DRA_DRIVER}"
    try:
        await wait_for(lambda: cluster.get(slice_path), 90, "the driver's ResourceSlice")
        yield DraNode(node, backend, cfg)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await api.close()
        cluster.request("DELETE", slice_path)
        cluster.request("DELETE", CLASS_PATH)


@pytest.fixture
async def dra_node(cluster: ControlPlane, nodes: Nodes, sock_dir: Path) -> AsyncIterator[DraNode]:
    """A DRA node of two GPUs (running_dra_node)."""
    async with running_dra_node(cluster, nodes, sock_dir, 2) as node:
        yield node


def plain_pod(name: str, node: str, resources: dict[str, str]) -> dict[str, Any]:
    """A pod as written for the device plugin: extended resources in its limits, no claim."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": resources}}],
        },
    }  # fmt: skip


def unschedulable(cluster: ControlPlane, namespace: str, pod: str) -> str:
    got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod}") or {}
    for cond in (got.get("status") or {}).get("conditions") or []:
        if (cond["type"], cond["status"], cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(cond.get("message", ""))
    return ""


async def scheduled(
    cluster: ControlPlane, namespace: str, pod: str, scheduler: Process
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod once bound with its extended resource claim recorded in its status, and that claim."""

    def bound() -> Any:
        got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod}") or {}
        done = got.get("spec", {}).get("nodeName") and got.get("status", {}).get(
            "extendedResourceClaimStatus"
        )
        return got if done else None

    got = await wait_for(bound, 90, f"{pod} bound", lambda: scheduler.log.read_text()[-3000:])
    name = got["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = cluster.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")
    assert claim is not None
    return got, claim


async def prepare(cfg: AgentConfig, claim: dict[str, Any]) -> Any:
    """The kubelet's NodePrepareResources for the claim (it sends namespace, name and UID only)."""
    meta = claim["metadata"]
    async with grpc.aio.insecure_channel(f"unix://{cfg.dra_socket}") as channel:
        resp = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])]
            ),
            timeout=60,
        )
    answer = resp.claims[meta["uid"]]
    assert answer.error == "", answer.error
    return answer


def cdi_env(cfg: AgentConfig, claim_uid: str) -> dict[str, str]:
    spec = json.loads((cfg.cdi_dir / f"{contract.DRA_DRIVER}-{claim_uid}.json").read_text())
    envs = {tuple(d["containerEdits"]["env"]) for d in spec["devices"]}
    assert len(envs) == 1  # every CDI device of a claim carries the claim's whole lane
    return dict(e.split("=", 1) for e in envs.pop())


async def test_a_pod_asking_tessera_gpu_gets_a_whole_gpu_lane_from_a_claim_the_scheduler_made(
    cluster: ControlPlane, dra_node: DraNode, namespace: str, scheduler: Process
) -> None:
    node = dra_node.name
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", plain_pod("train", node, {contract.RESOURCE_GPU: "1"})
    )
    assert status == 201, body
    pod, claim = await scheduled(cluster, namespace, "train", scheduler)
    assert pod["spec"]["nodeName"] == node
    assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
        {
            "containerName": "main",
            "resourceName": contract.RESOURCE_GPU,
            "requestName": "container-0-request-0",
        }
    ]
    # The claim kube-scheduler made: named after the pod, owned by it, marked, one request of the class.
    meta = claim["metadata"]
    assert meta["name"].startswith("train-extended-resources-")
    assert meta["annotations"][EXTENDED_CLAIM_ANNOTATION] == "true"
    assert [o["uid"] for o in meta["ownerReferences"]] == [pod["metadata"]["uid"]]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == contract.DRA_DEVICE_CLASS
    assert request["exactly"]["count"] == 1 and "capacity" not in request["exactly"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    gpu = next(g for g in dra_node.backend.gpus() if f"gpu-{g.index}" == result["device"])
    usable = usable_memory_mib(gpu)
    # No capacity asked: each capacity's default, the whole GPU.
    assert (result["pool"], result["request"]) == (node, "container-0-request-0")
    assert result["consumedCapacity"] == {"memory": f"{usable}Mi", "computeShare": "100", "clients": "1"}
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    answer = await prepare(dra_node.cfg, claim)
    (dev,) = answer.devices
    assert (list(dev.request_names), dev.device_name) == (["container-0-request-0"], result["device"])
    env = cdi_env(dra_node.cfg, meta["uid"])
    assert {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "TESSERA_LANE_ID")} == {
        "CUDA_VISIBLE_DEVICES": gpu.uuid,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={usable}M",
        "TESSERA_LANE_ID": meta["uid"],
    }  # fmt: skip
    assert env["TESSERA_PROGRESS_ENDPOINT"].endswith(f"/v1/namespaces/{namespace}/pods/train/progress")

    # gpu-memory and gpu-compute have no class: the same pod written with them fits no node.
    lane = {contract.RESOURCE_GPU: "1", contract.RESOURCE_GPU_MEMORY: "8192"}
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", plain_pod("lane", node, lane)
    )
    assert status == 201, body
    reason = await wait_for(
        lambda: unschedulable(cluster, namespace, "lane"), 90, "the lane pod refused", lambda: ""
    )
    assert f"Insufficient {contract.RESOURCE_GPU_MEMORY}" in reason, reason


async def test_n_gpus_are_n_whole_devices_and_a_pod_past_them_waits(
    cluster: ControlPlane, dra_node: DraNode, namespace: str, scheduler: Process
) -> None:
    node = dra_node.name
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", plain_pod("pair", node, {contract.RESOURCE_GPU: "2"})
    )
    assert status == 201, body
    _, claim = await scheduled(cluster, namespace, "pair", scheduler)
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 2
    results = claim["status"]["allocation"]["devices"]["results"]
    # A whole GPU's default leaves nothing for a second share of it: two devices, not two shares of one.
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]
    assert {r["consumedCapacity"]["computeShare"] for r in results} == {"100"}

    answer = await prepare(dra_node.cfg, claim)
    assert sorted(d.device_name for d in answer.devices) == ["gpu-0", "gpu-1"]
    env = cdi_env(dra_node.cfg, claim["metadata"]["uid"])
    assert set(env["CUDA_VISIBLE_DEVICES"].split(",")) == {g.uuid for g in dra_node.backend.gpus()}

    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", plain_pod("third", node, {contract.RESOURCE_GPU: "1"})
    )
    assert status == 201, body
    reason = await wait_for(
        lambda: unschedulable(cluster, namespace, "third"), 90, "the third pod refused", lambda: ""
    )
    assert "cannot allocate all claims" in reason, reason
    got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/third") or {}
    assert not got["spec"].get("nodeName")


@pytest.fixture
def fit_ignoring_lanes(cluster: ControlPlane) -> Iterator[Process]:
    """kube-scheduler with tessera-scheduler's NodeResourcesFit arguments (it ignores tessera.io/gpu-memory and
    tessera.io/gpu-compute, which no node advertises and the extender accounts) as the default scheduler,
    the extender left out."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cluster.kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler", "pluginConfig": [{"name": "NodeResourcesFit", "args": {
            "ignoredResources": [contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU_COMPUTE]}}]}],
    }  # fmt: skip
    path = cluster.workdir / f"fit-ignoring-lanes-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(config))
    sched = cluster.spawn(
        path.stem,
        [str(cluster.assets / "kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1",
         f"--secure-port={free_port()}", "-v=2"],
    )  # fmt: skip
    try:
        wait_until(
            lambda: "Starting Kubernetes Scheduler" in sched.log.read_text(), 60, "kube-scheduler", sched
        )
        yield sched
    finally:
        sched.stop()


async def test_the_class_makes_device_plugin_pods_asking_gpu_memory_unschedulable(
    cluster: ControlPlane, nodes: Nodes, namespace: str, fit_ignoring_lanes: Process
) -> None:
    """Why `auto` leaves the name out by default: where the device plugin serves tessera.io/gpu (a node that
    advertises it), a class naming it still makes the DynamicResources plugin check every extended resource
    of the pod, and tessera.io/gpu-memory, which no node advertises, then fits nowhere."""
    node = nodes.add(f"dp-{secrets.token_hex(3)}", gpus=2, slots_per_gpu=4)
    lane = {contract.RESOURCE_GPU: "1", contract.RESOURCE_GPU_MEMORY: "8192"}
    cluster.request("DELETE", CLASS_PATH)
    await wait_for(lambda: cluster.get(CLASS_PATH) is None, 60, "an earlier DeviceClass gone")
    try:
        status, body = cluster.request(
            "POST", f"{RESOURCE_API}/deviceclasses", device_class(contract.RESOURCE_GPU)
        )
        assert status == 201, body
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", plain_pod("with-class", node, lane)
        )
        assert status == 201, body
        reason = await wait_for(
            lambda: unschedulable(cluster, namespace, "with-class"), 90, "the pod refused", lambda: ""
        )
        assert "cannot fit resource" in reason, reason

        status, body = cluster.request("DELETE", CLASS_PATH)
        assert status == 200, body
        await wait_for(lambda: cluster.get(CLASS_PATH) is None, 60, "the class gone")
        status, body = cluster.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
        assert status == 201, body
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", plain_pod("without", node, lane)
        )
        assert status == 201, body

        def bound() -> Any:
            got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/without") or {}
            return got.get("spec", {}).get("nodeName")

        assert (
            await wait_for(bound, 90, "the pod bound", lambda: fit_ignoring_lanes.log.read_text()[-3000:])
            == node
        )
    finally:
        cluster.request("DELETE", CLASS_PATH)


@pytest.fixture
def tessera_scheduler(cluster: ControlPlane, chart_rbac: dict[str, Credentials]) -> Iterator[Scheduling]:
    """tessera-scheduler and its extender as the chart runs them with `lanes.api: dra`, the handoff on (the
    chart's default) with a stale time past every deadline here: no kubelet calls Allocate in these tests, so
    a pod the extender took to wait for one would hold its node for the rest of the test."""
    args = ("--dra-claims", "--handoff-stale", "600")
    with run_scheduling(cluster, chart_rbac["scheduler"], args) as started:
        yield started


async def test_through_tessera_scheduler_the_assignment_names_the_gpus_the_claim_got(
    cluster: ControlPlane, nodes: Nodes, sock_dir: Path, namespace: str, tessera_scheduler: Scheduling
) -> None:
    """Four GPUs, 70 % of gpu-0 held by another pod's lane claim. A pod asking `tessera.io/gpu: 1` through
    tessera-scheduler is allocated gpu-1 by the DynamicResources plugin (the first whole GPU), one asking 2
    gets gpu-2 and gpu-3; the extender's bind writes the assignment naming exactly the GPUs of each pod's claim
    (UUIDs as the agent's inventory lists them), and the operator's view reads those as the pod's GPUs. The
    second pod is bound at once: a claim's pod waits for no Allocate, so the handoff does not hold the node."""
    from .test_dra_packing import lane_pod, lane_template, placed

    sched = tessera_scheduler.scheduler
    async with running_dra_node(cluster, nodes, sock_dir, 4) as dra:
        node = dra.name
        pods = f"/api/v1/namespaces/{namespace}/pods"
        held = lane_template(
            namespace, "held", "28Gi", "70", select=f'device.attributes["{contract.DRA_DRIVER}"].index == 0'
        )
        status, body = cluster.request(
            "POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates", held
        )
        assert status == 201, body
        status, body = cluster.request(
            "POST", pods, lane_pod("holder", "held", "1", contract.SCHEDULER_NAME, node=node)
        )
        assert status == 201, body
        holder = await wait_for(
            lambda: placed(cluster, namespace, "holder"), 90, "the holder placed", sched.tail
        )
        assert holder == (node, [(node, "gpu-0")]), holder

        uuids = {g.index: g.uuid for g in dra.backend.gpus()}
        usable = usable_memory_mib(dra.backend.gpus()[0])
        for name, count, want in (("one", 1, [1]), ("two", 2, [2, 3])):
            body = plain_pod(name, node, {contract.RESOURCE_GPU: str(count)})
            body["spec"]["schedulerName"] = contract.SCHEDULER_NAME
            status, out = cluster.request("POST", pods, body)
            assert status == 201, out
            pod, claim = await scheduled(cluster, namespace, name, sched)
            results = claim["status"]["allocation"]["devices"]["results"]
            got = [
                int(r["device"].removeprefix("gpu-")) for r in results if r["driver"] == contract.DRA_DRIVER
            ]
            assert sorted(got) == want, results
            assignment = Assignment.parse(pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
            assert (assignment.node, assignment.gpu_indices) == (node, got), assignment
            assert assignment.gpu_uuids == [uuids[i] for i in got]
            assert (assignment.memory_mib, assignment.compute_percent) == (usable, 100)
            info = pod_info(pod)
            assert (info.node, info.gpu_indices) == (node, tuple(got))
