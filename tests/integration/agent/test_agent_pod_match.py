"""Which pod an Allocate serves: the kubelet's requests never name it (issue 44).

A fake kubelet admits pods as the real one does — GetPreferredAllocation, then Allocate with the slots it chose,
one pod at a time, in an order of its own — over the agent's real gRPC socket, and checks each container's env
against the pod it was admitting (which the kubelet knows and the agent is not told).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.plugin import DevicePlugin
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import StaticPodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc

from .agent_fake_kubelet import FakeKubelet, lane_pod

NODE = "node-a"
SLOTS = 4


@pytest.fixture
def backend() -> FakeGpuBackend:
    return FakeGpuBackend.uniform(2)


@pytest.fixture
async def plugin(
    plugin_dir: Path, kubelet: FakeKubelet, backend: FakeGpuBackend
) -> AsyncIterator[tuple[DevicePlugin, StaticPodSource]]:
    cfg = AgentConfig(
        node_name=NODE,
        device_plugin_dir=plugin_dir,
        mps_root=plugin_dir / "mps",
        slots_per_gpu=SLOTS,
        restart_poll_s=0.05,
    )
    source = StaticPodSource()
    dp = DevicePlugin(cfg, backend, source, AgentMetrics())
    stop = asyncio.Event()
    task = asyncio.create_task(dp.run(stop))
    await asyncio.wait_for(kubelet.registered.wait(), 10)
    yield dp, source
    stop.set()
    await asyncio.wait_for(task, 10)


async def admit(
    stub: api_pb2_grpc.DevicePluginStub, available: list[str]
) -> tuple[list[str], dict[str, str]]:
    """One container's device admission as the kubelet does it: ask for a preference, allocate what it names."""
    pref = await stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)
            ]
        )
    )
    chosen = list(pref.container_responses[0].deviceIDs)
    resp = await stub.Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)])
    )
    return chosen, dict(resp.container_responses[0].envs)


async def test_two_pods_admitted_newest_first_never_get_each_others_gpu(
    plugin: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    """The defect of issue 44: A (older, GPU 0) and B (newer, GPU 1) wait together; the kubelet admits B first.
    The agent used to steer B's slot onto A's GPU and serve A's lane to B's container, then B's lane to A's.
    Now a container gets its own pod's GPU and lane, or Allocate is refused; never another pod's."""
    _, source = plugin
    u0, u1 = (g.uuid for g in backend.gpus())
    a = lane_pod("a", u0, 0, created="2024-01-01T00:00:00Z")
    b = lane_pod("b", u1, 1, created="2024-01-01T00:00:05Z")
    source.pods = [a, b]
    available = [f"{u}::{k}" for u in (u0, u1) for k in range(SLOTS)]
    served: dict[str, str] = {}  # pod the kubelet admitted → the GPU its container was given
    refused: dict[str, str] = {}
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        for admitting in ("b", "a"):  # the kubelet's own order: not the pods' creation order
            try:
                chosen, envs = await admit(stub, available)
            except grpc.aio.AioRpcError as err:
                refused[admitting] = err.details() or ""
                # the kubelet fails a pod whose admission Allocate refused (UnexpectedAdmissionError)
                source.pods = [replace(p, phase="Failed") if p.name == admitting else p for p in source.pods]
                continue
            available = [d for d in available if d not in chosen]
            served[admitting] = envs["CUDA_VISIBLE_DEVICES"]
            assert envs["TESSERA_LANE_ID"] == f"lane-{admitting}", (
                f"pod {admitting}'s container got lane {envs['TESSERA_LANE_ID']}"
            )
    assert served.get("b", u1) == u1 and served.get("a", u0) == u0, served
    # the ambiguous first admission is refused with the reason, and the pod left alone is then served
    assert "2 pods on node node-a wait for 1 tessera.io/gpu at once (ml/a, ml/b)" in refused["b"]
    assert served == {"a": u0}


async def test_one_waiting_pod_is_served_whatever_slot_the_kubelet_picks(
    plugin: tuple[DevicePlugin, StaticPodSource], kubelet: FakeKubelet, backend: FakeGpuBackend
) -> None:
    """With the extender's handoff a node has one pod waiting at a time: it is the pod, and its env is its own
    assignment even where the kubelet ignores the preference and allocates a slot of another GPU."""
    _, source = plugin
    u0, u1 = (g.uuid for g in backend.gpus())
    source.pods = [lane_pod("a", u1, 1)]
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        chosen, _ = await admit(stub, [f"{u}::{k}" for u in (u0, u1) for k in range(SLOTS)])
        assert [c.rpartition("::")[0] for c in chosen] == [u1]  # steered onto its GPU
        source.pods = [lane_pod("b", u1, 1)]
        resp = await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{u0}::3"])]
            )
        )
    envs = resp.container_responses[0].envs
    assert (envs["CUDA_VISIBLE_DEVICES"], envs["TESSERA_LANE_ID"]) == (u1, "lane-b")
