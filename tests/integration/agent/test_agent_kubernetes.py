"""The agent's Kubernetes adapters against a real HTTP API server (kmock's KubernetesEmulator): the pod
source, the node patcher, the progress endpoint, and the annotation contract with the extender
(its model writes the assignment Allocate consumes; its view parses the inventory the agent writes)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import kmock
import pytest
from tessera.api import contract
from tessera.extender.server import Extender
from tessera.extender.view import SchedulerCache
from tessera.kube import KubeClient, KubeConfig
from tessera.sdk import ProgressError, report_progress
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.gpus.inventory import InventoryPublisher, KubernetesNodePatcher
from tessera_agent.kubelet.allocate import progress_endpoint
from tessera_agent.kubelet.plugin import DevicePlugin
from tessera_agent.lanes.progress import ProgressServer
from tessera_agent.pods import KubernetesPodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc

from .agent_fake_kubelet import FakeKubelet

NODE = "node-a"
PODS = "v1/pods"
NODES = "v1/nodes"
U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
U1 = "GPU-bbbbbbbb-0000-4000-8000-000000000000"


@pytest.fixture
async def api(kmock: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    kmock.resources[PODS] = kmock.ResourceInfo(
        kind="Pod", namespaced=True, verbs={"list", "watch", "get", "patch", "create", "delete"}
    )
    kmock.resources[NODES] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs={"list", "watch", "get", "patch"}
    )
    kube = KubeClient(KubeConfig(str(kmock.url).rstrip("/")))
    yield kube
    await kube.close()


def seed_pod(
    kmock: kmock.KubernetesEmulator,
    name: str,
    *,
    node: str | None = NODE,
    assignment: dict[str, Any] | None = None,
    resources: dict[str, str] | None = None,
) -> None:
    annotations = {contract.ANN_ASSIGNMENT: json.dumps(assignment)} if assignment else {}
    spec: dict[str, Any] = {
        "schedulerName": contract.SCHEDULER_NAME,
        "containers": [{"name": "main", "resources": {"limits": resources or {contract.RESOURCE_GPU: "1"}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    kmock.objects[PODS, "ml", name] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "annotations": annotations,
        },
        "spec": spec,
    }


def seed_node(kmock: kmock.KubernetesEmulator, name: str = NODE) -> None:
    kmock.objects[NODES, None, name] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1"},
    }


async def get(kmock: kmock.KubernetesEmulator, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(str(kmock.url).rstrip("/") + path) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, Any] = await resp.json()
        return out


def assignment(gpu: str = U1, index: int = 1, node: str = NODE) -> dict[str, Any]:
    return {
        "node": node,
        "gpuUUIDs": [gpu],
        "gpuIndices": [index],
        "laneId": "g1-l1",
        "memoryMiB": 4096,
        "computePercent": 30,
    }


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tsk-", dir="/tmp"))  # short: unix socket paths are capped at 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_pod_source_lists_this_nodes_pods_and_marks_allocation(
    kmock: kmock.KubernetesEmulator, api: KubeClient
) -> None:
    seed_pod(kmock, "mine", assignment=assignment())
    seed_pod(kmock, "plain")
    seed_pod(kmock, "elsewhere", node="node-b", assignment=assignment(node="node-b"))
    seed_pod(kmock, "pending", node=None)
    source = KubernetesPodSource(api)

    pods = await source.pods_on_node(NODE)
    assert sorted(p.name for p in pods) == ["mine", "plain"]
    (mine,) = [p for p in pods if p.name == "mine"]
    assert mine.assignment is not None and mine.assignment.gpu_uuids == [U1]
    assert mine.gpu_requests == (1,) and not mine.allocated
    lists = [r for r in kmock if r.method == "GET" and r.resource and r.resource.plural == "pods"]
    assert lists[0].params == {"fieldSelector": f"spec.nodeName={NODE}"}  # the server is asked to filter

    await source.mark_allocated(mine, [f"{U1}::3"])
    stored = await get(kmock, "/api/v1/namespaces/ml/pods/mine")
    assert stored["metadata"]["annotations"][contract.ANN_ALLOCATED] == f"{U1}::3"
    assert contract.ANN_ASSIGNMENT in stored["metadata"]["annotations"]  # merged, not replaced
    (again,) = [p for p in await source.pods_on_node(NODE) if p.name == "mine"]
    assert again.allocated


async def test_node_patcher_writes_the_inventory_the_extender_view_parses(
    kmock: kmock.KubernetesEmulator, api: KubeClient
) -> None:
    seed_node(kmock)
    backend = FakeGpuBackend(
        [
            GpuDevice(0, U0, "NVIDIA H100 80GB HBM3", 81559 * MIB, 527 * MIB),
            GpuDevice(1, U1, "NVIDIA H100 80GB HBM3", 81559 * MIB, 527 * MIB),
        ]
    )
    publisher = InventoryPublisher(NODE, backend, KubernetesNodePatcher(api), extra_reserve_mib=32)
    assert await publisher.publish_if_changed()
    backend.inject_fault(U1)
    assert await publisher.publish_if_changed()

    node = await get(kmock, f"/api/v1/nodes/{NODE}")
    view = SchedulerCache()
    view.apply_node(node)
    assert view.node_errors == {}
    assert [(g.index, g.uuid, g.memory_mib, g.healthy) for g in view.nodes[NODE]] == [
        (0, U0, 81559 - 527 - 32, True),
        (1, U1, 81559 - 527 - 32, False),
    ]


class BindingKubeClient(KubeClient):
    """The extender's API client; kmock has no pods/binding subresource, so a Binding is applied the way the
    API server applies it: by setting spec.nodeName."""

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> dict[str, Any]:
        return await self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            body={"spec": {"nodeName": node}},
            content_type="application/merge-patch+json",
        )


async def test_extender_assignment_is_what_allocate_consumes(
    kmock: kmock.KubernetesEmulator, api: KubeClient, sock_dir: Path
) -> None:
    # the agent publishes its GPUs; the extender learns them through its own view
    seed_node(kmock)
    backend = FakeGpuBackend.uniform(2)
    await InventoryPublisher(NODE, backend, KubernetesNodePatcher(api)).publish_if_changed()
    gpus = {g.index: g.uuid for g in backend.gpus()}
    view = SchedulerCache()
    view.apply_node(await get(kmock, f"/api/v1/nodes/{NODE}"))
    # one pod asking for a 6 GiB, 40 % lane; the extender binds it and writes the assignment
    seed_pod(
        kmock,
        "train",
        node=None,
        resources={
            contract.RESOURCE_GPU: "1",
            contract.RESOURCE_GPU_MEMORY: "6144",
            contract.RESOURCE_GPU_COMPUTE: "40",
        },
    )
    view.apply_pod(await get(kmock, "/api/v1/namespaces/ml/pods/train"))
    kube = BindingKubeClient(KubeConfig(str(kmock.url).rstrip("/")))
    try:
        out = await Extender(kube, view).bind(
            {"PodName": "train", "PodNamespace": "ml", "PodUID": "uid-train", "Node": NODE}
        )
    finally:
        await kube.close()
    assert out == {"Error": ""}
    written = json.loads(
        (await get(kmock, "/api/v1/namespaces/ml/pods/train"))["metadata"]["annotations"][
            contract.ANN_ASSIGNMENT
        ]
    )
    uuid = written["gpuUUIDs"][0]
    assert uuid == gpus[written["gpuIndices"][0]]

    # kubelet asks the agent to allocate a slot on that GPU; the agent reads the pod from the API server
    kubelet = FakeKubelet(sock_dir)
    await kubelet.start()
    cfg = AgentConfig(
        node_name=NODE,
        device_plugin_dir=sock_dir,
        slots_per_gpu=4,
        mps_root=sock_dir / "mps",  # the lane's own directories, not the host's /run
        progress_socket=sock_dir / "p.sock",
    )
    plugin = DevicePlugin(cfg, backend, KubernetesPodSource(api))
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        await asyncio.wait_for(kubelet.registered.wait(), 5)
        async with kubelet.plugin_channel() as ch:
            resp = await api_pb2_grpc.DevicePluginStub(ch).Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}::2"])]
                )
            )
    except grpc.aio.AioRpcError as err:  # pragma: no cover - the message is the diagnosis
        raise AssertionError(err.details()) from err
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await kubelet.stop()
    envs = dict(resp.container_responses[0].envs)
    assert envs[contract.ENV_CUDA_VISIBLE_DEVICES] == uuid
    assert envs[contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=6144M"
    assert envs[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "40"
    assert envs[contract.ENV_LANE_ID] == written["laneId"]
    assert envs[contract.ENV_PROGRESS_ENDPOINT] == (
        "http+unix://%2Frun%2Ftessera%2Fprogress%2Fp.sock/v1/namespaces/ml/pods/train/progress"
    )
    stored = await get(kmock, "/api/v1/namespaces/ml/pods/train")
    assert stored["metadata"]["annotations"][contract.ANN_ALLOCATED] == f"{uuid}::2"


@pytest.fixture
async def progress(
    kmock: kmock.KubernetesEmulator, api: KubeClient, sock_dir: Path
) -> AsyncIterator[ProgressServer]:
    server = ProgressServer(NODE, KubernetesPodSource(api), socket_path=sock_dir / "progress.sock")
    await server.start()
    yield server
    await server.stop()


def endpoint(server: ProgressServer, name: str) -> str:
    assert server.socket_path is not None
    return progress_endpoint(str(server.socket_path), "ml", name)


async def test_progress_endpoint_writes_the_pod_annotation(
    kmock: kmock.KubernetesEmulator, progress: ProgressServer
) -> None:
    seed_pod(kmock, "train", assignment=assignment())
    # the SDK is blocking (workload side); run it off the loop that serves both the agent and kmock
    written = await asyncio.to_thread(
        report_progress, 40, 100, loss=0.75, endpoint=endpoint(progress, "train")
    )
    stored = await get(kmock, "/api/v1/namespaces/ml/pods/train")
    value = json.loads(stored["metadata"]["annotations"][contract.ANN_PROGRESS])
    assert value == json.loads(written)
    assert (value["iterations"], value["total"], value["loss"]) == (40, 100, 0.75)
    assert value["ts"] > 1.6e9
    assert contract.ANN_ASSIGNMENT in stored["metadata"]["annotations"]

    await asyncio.to_thread(report_progress, 41, endpoint=endpoint(progress, "train"))
    stored = await get(kmock, "/api/v1/namespaces/ml/pods/train")
    value = json.loads(stored["metadata"]["annotations"][contract.ANN_PROGRESS])
    assert (value["iterations"], value["total"], "loss" in value) == (41, None, False)


async def test_progress_endpoint_refuses_with_reasons(
    kmock: kmock.KubernetesEmulator, progress: ProgressServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_pod(kmock, "train", assignment=assignment())
    seed_pod(kmock, "plain")
    seed_pod(kmock, "elsewhere", node="node-b", assignment=assignment(node="node-b"))
    cases = [
        ("train", (101, 100), "iterations \\(101\\) exceed total \\(100\\)"),
        ("plain", (1, 10), "holds no Tessera lane"),
        ("elsewhere", (1, 10), "is not on node node-a"),
        ("ghost", (1, 10), "is not on node node-a"),
    ]
    for name, (n, total), message in cases:
        with pytest.raises(ProgressError, match=message):
            await asyncio.to_thread(report_progress, n, total, endpoint=endpoint(progress, name))
    stored = await get(kmock, "/api/v1/namespaces/ml/pods/train")
    assert contract.ANN_PROGRESS not in stored["metadata"]["annotations"]
    monkeypatch.delenv(contract.ENV_PROGRESS_ENDPOINT, raising=False)
    with pytest.raises(ProgressError, match="TESSERA_PROGRESS_ENDPOINT"):
        report_progress(1, endpoint="")
