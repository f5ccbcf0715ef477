"""The device plugin against a fake kubelet on temporary unix sockets (issue 7, first "done when" item)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.plugin import DevicePlugin
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import StaticPodSource, pod_info_from_manifest
from tessera_agent.proto import api_pb2, api_pb2_grpc

from .agent_fake_kubelet import FakeKubelet
from .waiting import until

NODE = "node-a"


def pod(
    name: str, gpus: int, assignment: dict[str, object] | None, created: str = "2024-01-01T00:00:00Z"
) -> dict:
    annotations = {contract.ANN_ASSIGNMENT: json.dumps(assignment)} if assignment else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {contract.RESOURCE_GPU: str(gpus)}}}]
        },
    }


@pytest.fixture
def backend() -> FakeGpuBackend:
    return FakeGpuBackend.uniform(2)


@pytest.fixture
async def running(
    plugin_dir: Path, kubelet: FakeKubelet, backend: FakeGpuBackend
) -> AsyncIterator[tuple[DevicePlugin, StaticPodSource]]:
    cfg = AgentConfig(
        node_name=NODE,
        device_plugin_dir=plugin_dir,
        slots_per_gpu=4,
        mps_root=plugin_dir / "mps",
        restart_poll_s=0.05,
    )
    uuids = [g.uuid for g in backend.gpus()]
    pods = StaticPodSource(
        [
            pod_info_from_manifest(
                pod(
                    "train-1",
                    1,
                    {
                        "node": NODE,
                        "gpuUUIDs": [uuids[1]],
                        "gpuIndices": [1],
                        "laneId": "lane-7",
                        "memoryMiB": 4096,
                        "computePercent": 30,
                    },
                )
            ),
            pod_info_from_manifest(pod("plain", 1, None)),
        ]
    )
    plugin = DevicePlugin(cfg, backend, pods, AgentMetrics())
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    await asyncio.wait_for(kubelet.registered.wait(), 5)
    yield plugin, pods
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_registers_with_kubelet(
    running: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet
) -> None:
    (req,) = kubelet.requests
    assert req.version == "v1beta1"
    assert req.endpoint == contract.AGENT_SOCKET_NAME
    assert req.resource_name == "tessera.io/gpu"
    assert req.options.get_preferred_allocation_available


async def test_list_and_watch_streams_slots_and_health_change(
    running: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    uuids = [g.uuid for g in backend.gpus()]
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        opts = await stub.GetDevicePluginOptions(api_pb2.Empty())
        assert opts.get_preferred_allocation_available and not opts.pre_start_required
        stream = stub.ListAndWatch(api_pb2.Empty())
        first = await asyncio.wait_for(stream.read(), 5)
        assert len(first.devices) == 8  # 2 GPUs x 4 slots
        assert {d.ID for d in first.devices} == {f"{u}::{k}" for u in uuids for k in range(4)}
        assert all(d.health == "Healthy" for d in first.devices)

        backend.inject_fault(uuids[0])
        second = await asyncio.wait_for(stream.read(), 5)
        health = {d.ID: d.health for d in second.devices}
        assert [health[f"{uuids[0]}::{k}"] for k in range(4)] == ["Unhealthy"] * 4
        assert [health[f"{uuids[1]}::{k}"] for k in range(4)] == ["Healthy"] * 4

        backend.recover(uuids[0])
        third = await asyncio.wait_for(stream.read(), 5)
        assert all(d.health == "Healthy" for d in third.devices)
        stream.cancel()


async def test_allocate_with_assignment_returns_lane_env_and_mounts(
    running: tuple[DevicePlugin, StaticPodSource],
    kubelet: FakeKubelet,
    backend: FakeGpuBackend,
    plugin_dir: Path,
) -> None:
    uuids = [g.uuid for g in backend.gpus()]
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        avail = [f"{u}::{k}" for u in uuids for k in range(4)]
        pref = await stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=avail, allocation_size=1)
                ]
            )
        )
        (chosen,) = pref.container_responses[0].deviceIDs
        assert chosen.startswith(uuids[1])  # steered onto the GPU the extender assigned

        resp = await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[chosen])]
            )
        )
        (c,) = resp.container_responses
        assert dict(c.envs) == {
            "CUDA_VISIBLE_DEVICES": uuids[1],
            "NVIDIA_VISIBLE_DEVICES": uuids[1],
            "CUDA_MPS_PIPE_DIRECTORY": "/mps/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
            "TESSERA_LANE_ID": "lane-7",
        }
        lane = plugin_dir / "mps" / "lanes" / "uid-train-1"  # the pod's own, made before Allocate answered
        assert {(m.container_path, m.host_path) for m in c.mounts} == {
            ("/mps/pipe", str(lane / "pipe")),
            ("/dev/shm", str(lane / "shm")),
        }
        assert (lane / "pipe").is_dir() and (lane / "shm").is_dir()
        assert [d.container_path for d in c.devices] == [
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        ]
    _, pods = running
    assert [p.allocated for p in pods.pods] == [True, False]


async def test_allocate_without_assignment_fails_with_reason(
    running: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    uuid = backend.gpus()[0].uuid
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        # two slots: no pod asks for 2, and the plain pod has no assignment
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}::0", f"{uuid}::1"])
                    ]
                )
            )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod on node node-a has a tessera.io/assignment annotation" in (err.value.details() or "")


async def test_second_allocate_for_same_pod_is_refused(
    running: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    uuid = backend.gpus()[1].uuid
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        req = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}::0"])]
        )
        await stub.Allocate(req)
        with pytest.raises(grpc.aio.AioRpcError, match="not yet allocated"):
            await stub.Allocate(req)


async def test_allocate_counter_counts_answers_by_result(
    running: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    plugin, _ = running
    metrics = plugin.servicer.metrics
    assert metrics is not None

    def count(result: str) -> float:
        value = metrics.registry.get_sample_value(
            "tessera_device_plugin_allocations_total", {"node": NODE, "result": result}
        )
        return value or 0.0

    uuid = backend.gpus()[1].uuid
    req = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}::0"])]
    )
    assert (count("ok"), count("error")) == (0.0, 0.0)
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        await stub.Allocate(req)
        assert (count("ok"), count("error")) == (1.0, 0.0)
        for _ in range(2):  # the only pod with an assignment is served: refused twice
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Allocate(req)
    assert (count("ok"), count("error")) == (1.0, 2.0)


async def test_reregisters_after_kubelet_restart(
    running: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    plugin, _ = running
    await kubelet.restart()  # deletes our socket like a new kubelet
    await asyncio.wait_for(kubelet.registered.wait(), 5)
    # The plugin may notice the old kubelet going away before the new one has cleared the directory, and
    # then register once more when its fresh socket is deleted too; what matters is it ends registered with
    # the new kubelet and serving.
    for _ in range(200):
        await asyncio.sleep(0.02)
        if plugin.registrations >= 2 and not plugin.kubelet_restarted():
            break
    assert kubelet.generations[0] == 0 and kubelet.generations[-1] == 1
    assert plugin.registrations >= 2 and not plugin.kubelet_restarted()
    assert (plugin_dir / contract.AGENT_SOCKET_NAME).exists()
    async with kubelet.plugin_channel() as ch:  # and the new server answers
        first = await asyncio.wait_for(
            api_pb2_grpc.DevicePluginStub(ch).ListAndWatch(api_pb2.Empty()).read(), 5
        )
        assert len(first.devices) == 8


class RefusingKubelet(FakeKubelet):
    """A kubelet whose Register refuses with `message`, as devicemanager does: a Go error, gRPC status UNKNOWN."""

    def __init__(self, plugin_dir: Path, message: str) -> None:
        super().__init__(plugin_dir)
        self.message = message
        self.watch: asyncio.Task[None] | None = None

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        self.requests.append(request)
        await context.abort(
            grpc.StatusCode.UNKNOWN, self.message.format(socket=self.plugin_dir / request.endpoint)
        )
        raise AssertionError("abort returns only by raising")

    def watch_plugin(self) -> None:
        """Hold a ListAndWatch stream open on the plugin, as a kubelet connected to it does."""

        async def watch() -> None:
            channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / contract.AGENT_SOCKET_NAME}")
            async with channel:
                async for _ in api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty()):
                    pass

        self.watch = asyncio.create_task(watch())

    async def stop(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self.watch
        await super().stop()


@contextlib.asynccontextmanager
async def plugin_against(kubelet: FakeKubelet, backend: FakeGpuBackend) -> AsyncIterator[DevicePlugin]:
    """A device plugin run against `kubelet` (started here) until the block ends."""
    await kubelet.start()
    cfg = AgentConfig(node_name=NODE, device_plugin_dir=kubelet.plugin_dir, restart_poll_s=0.05)
    plugin = DevicePlugin(cfg, backend, StaticPodSource())
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        yield plugin
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await kubelet.stop()


async def test_a_kubelet_already_connected_to_the_socket_counts_as_registered(
    plugin_dir: Path, backend: FakeGpuBackend
) -> None:
    """A Register whose answer the plugin never saw left the kubelet connected to the socket: it refuses every
    later Register for it so (devicemanager's PluginConnected). So does a kubelet still connected to an earlier
    server on that socket: the plugin asks again until the kubelet watches this one."""
    kubelet = RefusingKubelet(plugin_dir, "device plugin already connected: {socket}")
    async with plugin_against(kubelet, backend) as plugin:
        # Not while the kubelet holds no stream from this server (it has yet to see an earlier one go) ...
        await until(lambda: len(kubelet.requests) >= 2, "a second Register")
        assert plugin.registrations == 0 and "waiting for the kubelet" in (plugin.readiness() or "")
        # ... but once it watches this one, the refusal says the kubelet has it.
        kubelet.watch_plugin()
        await until(lambda: plugin.readiness() is None, "the plugin ready")
        assert plugin.readiness() is None and plugin.registrations == 1
    assert plugin.readiness() is not None  # stopped: not ready


async def test_any_other_refusal_is_retried_and_not_ready(plugin_dir: Path, backend: FakeGpuBackend) -> None:
    kubelet = RefusingKubelet(plugin_dir, "invalid resource name")
    async with plugin_against(kubelet, backend) as plugin:
        await until(lambda: len(kubelet.requests) >= 2, "a second Register")
        assert len(kubelet.requests) >= 2 and plugin.registrations == 0
        assert "waiting for the kubelet" in (plugin.readiness() or "")


async def test_clean_shutdown_removes_socket(
    plugin_dir: Path, kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    cfg = AgentConfig(node_name=NODE, device_plugin_dir=plugin_dir, restart_poll_s=0.05)
    plugin = DevicePlugin(cfg, backend, StaticPodSource())
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    await asyncio.wait_for(kubelet.registered.wait(), 5)
    assert cfg.plugin_socket.exists()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert not cfg.plugin_socket.exists()
