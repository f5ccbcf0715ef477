"""The lane audit finds a container on another pod's lane through the kubelet's PodResources API (issue 44).

A fake kubelet serves Registration and PodResources v1 on unix sockets; the agent's real device plugin and its
real PodResources client talk to it over gRPC. The swap is forced the way it would happen: the kubelet admits
pod B while the agent's pod view does not show B yet, so Allocate serves the one pod it sees waiting (A) and the
kubelet records A's slot under B.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.lane_audit import LaneAudit, find_mismatches
from tessera_agent.kubelet.plugin import DevicePlugin
from tessera_agent.kubelet.pod_resources import KubeletPodResources
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import StaticPodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc, podresources_v1_pb2_grpc

from .agent_fake_kubelet import FakeKubelet, FakePodResources, lane_pod

NODE = "node-a"


@dataclass
class Recorder:
    """Events and deletions, as the Kubernetes API would receive them."""

    pod_events: list[tuple[str, str, str]] = field(default_factory=list)
    node_events: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[tuple[str, str, str | None]] = field(default_factory=list)

    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None:
        self.pod_events.append((pod, reason, message))

    async def node_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.node_events.append((reason, message))

    async def delete_pod(self, namespace: str, name: str, *, uid: str | None = None) -> object:
        self.deleted.append((namespace, name, uid))
        return {}


@pytest.fixture
async def pod_resources(tmp_path: Path) -> AsyncIterator[tuple[FakePodResources, Path]]:
    fake = FakePodResources()
    server = grpc.aio.server()
    podresources_v1_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    sock = tmp_path / "pod-resources" / "kubelet.sock"
    sock.parent.mkdir()
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    yield fake, sock
    await server.stop(0)


async def test_a_forced_swap_is_found_reported_and_the_pod_deleted(
    plugin_dir: Path,
    kubelet: FakeKubelet,
    pod_resources: tuple[FakePodResources, Path],
) -> None:
    backend = FakeGpuBackend.uniform(2)
    u0, u1 = (g.uuid for g in backend.gpus())
    a, b = lane_pod("a", u0, 0), lane_pod("b", u1, 1)
    source = StaticPodSource([a])  # B is bound but not yet in the agent's view
    cfg = AgentConfig(
        node_name=NODE,
        device_plugin_dir=plugin_dir,
        mps_root=plugin_dir / "mps",
        slots_per_gpu=2,
        restart_poll_s=0.05,
    )
    plugin = DevicePlugin(cfg, backend, source, AgentMetrics())
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    fake, sock = pod_resources
    try:
        await asyncio.wait_for(kubelet.registered.wait(), 10)
        async with kubelet.plugin_channel() as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            resp = await stub.Allocate(  # the kubelet admits B with a slot on A's GPU
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{u0}::0"])]
                )
            )
        assert resp.container_responses[0].envs["TESSERA_LANE_ID"] == "lane-a"  # B's container got A's lane
        fake.held[("ml", "b")] = [f"{u0}::0"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    source.pods = [*source.pods, b]  # the view catches up

    metrics = AgentMetrics()
    rec = Recorder()
    audit = LaneAudit(NODE, KubeletPodResources(sock, contract.RESOURCE_GPU), source, rec, rec, metrics)
    assert await audit.check() == []  # seen once: not yet acted on
    (found,) = await audit.check()
    assert found.pod.key == "ml/b" and found.served == "ml/a" and found.devices == (f"{u0}::0",)
    assert rec.deleted == [("ml", "b", "uid-b")]
    ((pod, reason, message),) = rec.pod_events
    assert (pod, reason) == ("ml/b", "LaneMismatch")
    assert f"the kubelet gave pod ml/b devices {u0}::0, which Allocate served with pod ml/a's lane" in message
    assert rec.node_events == [("LaneMismatch", message)]
    text = generate_latest(metrics.registry).decode()
    assert 'tessera_agent_lane_mismatches_total{action="deleted",node="node-a"} 1.0' in text
    assert await audit.check() == []  # acted on once, not again while the pod is still there


async def test_report_only_leaves_the_pod_and_a_clean_node_has_no_mismatch(
    pod_resources: tuple[FakePodResources, Path],
) -> None:
    fake, sock = pod_resources
    u0 = "GPU-0"
    a = replace(lane_pod("a", u0, 0), allocated=True, allocated_ids=(f"{u0}::0",))
    b = replace(lane_pod("b", u0, 0), allocated=True, allocated_ids=(f"{u0}::1",))
    fake.held = {("ml", "a"): [f"{u0}::0"], ("ml", "b"): [f"{u0}::1"]}
    source = StaticPodSource([a, b])
    rec = Recorder()
    audit = LaneAudit(
        NODE, KubeletPodResources(sock, contract.RESOURCE_GPU), source, rec, rec, on_mismatch="report"
    )
    for _ in range(3):
        assert await audit.check() == []
    fake.held = {("ml", "a"): [f"{u0}::1"], ("ml", "b"): [f"{u0}::0"]}  # each runs on the other's lane
    await audit.check()
    found = await audit.check()
    assert sorted((m.pod.key, m.served) for m in found) == [("ml/a", "ml/b"), ("ml/b", "ml/a")]
    assert rec.deleted == [] and "left running (--on-lane-mismatch report)" in rec.pod_events[0][2]


async def test_an_unreadable_pod_resources_socket_is_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    audit = LaneAudit(
        NODE,
        KubeletPodResources(tmp_path / "none.sock", contract.RESOURCE_GPU),
        StaticPodSource(),
        None,
        None,
    )
    assert await audit.check() == [] and await audit.check() == []
    assert [r.message for r in caplog.records].count(
        f"lane audit cannot read the kubelet's PodResources API: {tmp_path / 'none.sock'} does not exist (is the "
        "kubelet's pod-resources directory mounted into the agent?)"
    ) == 1


def test_the_rule() -> None:
    u0 = "GPU-0"
    served = replace(lane_pod("a", u0, 0), allocated=True, allocated_ids=(f"{u0}::0",))
    own = replace(lane_pod("b", u0, 0), allocated=True, allocated_ids=(f"{u0}::1",))
    waiting = lane_pod("c", u0, 0)
    # all well: each holds what it was served with (order of IDs aside)
    assert find_mismatches({"ml/a": (f"{u0}::0",), "ml/b": (f"{u0}::1",)}, [served, own, waiting]) == []
    # c holds a's devices: c runs on a's lane
    (m,) = find_mismatches({"ml/a": (f"{u0}::0",), "ml/c": (f"{u0}::0",)}, [served, own, waiting])
    assert (m.pod.key, m.served) == ("ml/c", "ml/a")
    # b holds devices nobody was served with, while its own record names others
    (m,) = find_mismatches({"ml/b": (f"{u0}::7",)}, [served, own, waiting])
    assert (m.pod.key, m.served) == ("ml/b", "")
    # devices no pod records, on a pod with no record either (served before the record existed): left alone
    assert find_mismatches({"ml/c": (f"{u0}::5",)}, [waiting]) == []
    # gone from the API, finished, or not a lane pod: left alone
    assert find_mismatches({"ml/x": (f"{u0}::0",)}, [served]) == []
    assert find_mismatches({"ml/c": (f"{u0}::0",)}, [served, replace(waiting, phase="Succeeded")]) == []
    assert find_mismatches({"ml/c": (f"{u0}::0",)}, [served, replace(waiting, assignment=None)]) == []
