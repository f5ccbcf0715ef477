"""Lanes' GPU memory on their pod cgroups through the cgroup dmem controller (issue 39), on a fake host cgroup tree
(`tests/unit/agent/dmem_tree.py`: the kernel's files and kubelet's layout):

- device-plugin mode, a real `tessera-agent` process against a fake kubelet: the plugin asks for
  PreStartContainer, which writes the lane's memory on the pod's cgroup before the container starts; a
  restarted agent writes it again; `--dmem required` refuses to start where the kernel offers no dmem;
- DRA mode, the agent's DRA driver over its gRPC socket: NodePrepareResources writes the claim's memory on
  its pod's cgroup, the agent's round reaches a pod that shares the claim later, and unpreparing the claim
  releases the pod's protection.

Values are checked against the kernel's format (`<region> <bytes|max>`, Documentation/admin-guide/cgroup-v2.rst
"DMEM") and the lane's memory in bytes, not against the agent's own code.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tessera.api import contract
from tessera_agent.agent import NodeAgent
from tessera_agent.config import AgentConfig
from tessera_agent.enforce.dmem import DmemLimits, detect
from tessera_agent.enforce.dmem_lanes import DmemLanes
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import StaticPodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc, dra_v1_pb2

from tests.unit.agent import dmem_tree as tree
from tests.unit.agent.dmem_tree import REGIONS, lines, uid

from .agent_fake_kubelet import FakeKubelet
from .test_agent_dra import NODE, FakeDraApi, dra_stub, result
from .waiting import until

FAKE_MPS = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")
UUIDS = [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(2)]  # FakeGpuBackend.uniform's
MIB = 1024 * 1024
DEADLINE_S = 30.0


def value(path: Path, region: str) -> str | None:
    try:
        return lines(path).get(region)
    except FileNotFoundError:
        return None


# --- device-plugin mode ------------------------------------------------------------------------------------
def lane_pod(pod_uid: str, gpu: int, mib: int, allocated: str | None = None) -> dict[str, Any]:
    assignment = {
        "node": "n1",
        "gpuUUIDs": [UUIDS[gpu]],
        "gpuIndices": [gpu],
        "laneId": "lane-a",
        "memoryMiB": mib,
        "computePercent": 30,
    }
    annotations = {contract.ANN_ASSIGNMENT: json.dumps(assignment)}
    if allocated:  # as the API server holds it once Allocate marked the pod
        annotations[contract.ANN_ALLOCATED] = allocated
    return {
        "metadata": {"namespace": "ml", "name": "a", "uid": pod_uid, "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
    }


async def start_agent(plugin_dir: Path, kubelet: FakeKubelet, *extra: str) -> asyncio.subprocess.Process:
    kubelet.registered.clear()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        *("--node", "n1", "--fake-gpus", "2", "--fake-pods", str(plugin_dir / "pods.json")),
        *("--device-plugin-dir", str(plugin_dir), "--mps-root", str(plugin_dir / "mps")),
        *("--mps-binary", FAKE_MPS, "--metrics-port", "0"),
        # one round at start, the next a minute later: within a test only PreStartContainer writes, but
        # for the round a restarted agent runs at once
        *("--sample-interval", "60"),
        *("--dmem", "required", "--cgroup-root", str(plugin_dir / "sys-fs-cgroup")),
        *extra,
    )
    await asyncio.wait_for(kubelet.registered.wait(), DEADLINE_S)
    return proc


async def stop_agent(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0


@pytest.mark.parametrize("layout", ["v2", "hybrid"])
async def test_prestart_writes_the_lanes_memory_on_the_pods_cgroup_and_a_restart_writes_it_again(
    plugin_dir: Path, kubelet: FakeKubelet, layout: str
) -> None:
    root = tree.host(plugin_dir / "sys-fs-cgroup", layout=layout)
    pod_cg = tree.pod(root, uid(1), driver="systemd", qos="burstable")
    (plugin_dir / "pods.json").write_text(json.dumps([lane_pod(uid(1), 1, 4096)]))
    agent = await start_agent(plugin_dir, kubelet)
    try:
        assert kubelet.requests[-1].options.pre_start_required  # registered asking for PreStartContainer
        slot = f"{UUIDS[1]}::0"
        async with kubelet.plugin_channel() as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).pre_start_required
            await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[slot])]
                )
            )
            await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[slot]))
        # the lane's 4096 MiB on GPU 1 (bus 00000000:02:00.0), hard and guaranteed; GPU 0 at the kernel's default
        assert value(pod_cg / "dmem.max", REGIONS[1]) == str(4096 * MIB)
        assert value(pod_cg / "dmem.min", REGIONS[1]) == str(4096 * MIB)
        assert value(pod_cg / "dmem.max", REGIONS[0]) == "max"
        # the pod's ancestors cover it; the root is never written
        assert value(pod_cg.parent / "dmem.min", REGIONS[1]) == str(4096 * MIB)
        assert value(pod_cg.parent.parent / "dmem.min", REGIONS[1]) == str(4096 * MIB)
        assert not (root / "dmem.max").exists()
    finally:
        await stop_agent(agent)

    # Undone while the agent was away; the restarted agent, finding the pod allocated, writes it again, and
    # answers a PreStartContainer for the pod's slot from the pod's tessera.io/allocated.
    (pod_cg / "dmem.max").write_text(f"{REGIONS[1]} max\n")
    (plugin_dir / "pods.json").write_text(json.dumps([lane_pod(uid(1), 1, 4096, allocated=slot)]))
    agent = await start_agent(plugin_dir, kubelet)
    try:
        await until(lambda: value(pod_cg / "dmem.max", REGIONS[1]) == str(4096 * MIB), "the limit again")
        (pod_cg / "dmem.max").write_text(f"{REGIONS[1]} max\n")
        async with kubelet.plugin_channel() as ch:
            await api_pb2_grpc.DevicePluginStub(ch).PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=[slot])
            )
        assert value(pod_cg / "dmem.max", REGIONS[1]) == str(4096 * MIB)
    finally:
        await stop_agent(agent)


async def test_required_prestart_for_a_pod_without_a_cgroup_fails_the_start(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    tree.host(plugin_dir / "sys-fs-cgroup")  # kubelet made no cgroup for the pod (cgroupsPerQOS off)
    (plugin_dir / "pods.json").write_text(json.dumps([lane_pod(uid(1), 0, 1024)]))
    agent = await start_agent(plugin_dir, kubelet)
    try:
        slot = f"{UUIDS[0]}::0"
        async with kubelet.plugin_channel() as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[slot])]
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[slot]))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"pod ml/a: pod {uid(1)} has no pod cgroup" in (err.value.details() or "")
    finally:
        await stop_agent(agent)


async def test_required_refuses_to_start_without_dmem_and_says_how_to_fix_it(plugin_dir: Path) -> None:
    tree.host(plugin_dir / "sys-fs-cgroup", controllers="cpuset cpu io memory pids")
    (plugin_dir / "pods.json").write_text("[]")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        *("--node", "n1", "--fake-gpus", "1", "--fake-pods", str(plugin_dir / "pods.json")),
        *("--device-plugin-dir", str(plugin_dir), "--no-mps", "--metrics-port", "0"),
        *("--dmem", "required", "--cgroup-root", str(plugin_dir / "sys-fs-cgroup")),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), DEADLINE_S)
    assert proc.returncode == 1
    text = err.decode()
    assert "--dmem required: the kernel offers no dmem controller" in text
    assert "--dmem auto|off" in text and "Linux 6.14" in text


# --- DRA mode ----------------------------------------------------------------------------------------------
def claim(name: str, claim_uid: str, results: list[dict[str, Any]], pods: list[tuple[str, str]]) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": claim_uid},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods],
        },
    }


@pytest.fixture
def dra_cfg(plugin_dir: Path) -> AgentConfig:
    return AgentConfig(
        node_name=NODE,
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        lanes_api="dra",
    )


@pytest.fixture
async def dra_agent(
    plugin_dir: Path, dra_cfg: AgentConfig
) -> AsyncIterator[tuple[NodeAgent, FakeDraApi, Path]]:
    root = tree.host(plugin_dir / "sys-fs-cgroup")
    backend = FakeGpuBackend.uniform(2)
    api = FakeDraApi()
    dmem = DmemLanes(DmemLimits(detect(backend.gpus(), plugin_dir / "sys-fs-cgroup")), NODE, required=True)
    agent = NodeAgent(
        dra_cfg, backend, StaticPodSource([]), None, AgentMetrics(), dra=api, dmem=dmem, sample_interval_s=0.2
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await until(lambda: dra_cfg.dra_registration_socket.exists() and bool(api.slices), "the driver serving")
    yield agent, api, root
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)


async def prepare(cfg: AgentConfig, name: str, claim_uid: str) -> str:
    channel, stub = dra_stub(cfg)
    async with channel:
        got = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=claim_uid)]
            ),
            timeout=DEADLINE_S,
        )
    return got.claims[claim_uid].error


async def test_prepare_writes_the_claims_memory_on_its_pods_cgroup_and_unprepare_releases_it(
    dra_agent: tuple[NodeAgent, FakeDraApi, Path], dra_cfg: AgentConfig
) -> None:
    _, api, root = dra_agent
    p1 = tree.pod(root, uid(1), driver="cgroupfs", qos="burstable")
    api.claims[("ml", "solo")] = claim("solo", "claim-1", [result("gpu-1", "10Gi", "30")], [("p1", uid(1))])
    assert await prepare(dra_cfg, "solo", "claim-1") == ""
    assert value(p1 / "dmem.max", REGIONS[1]) == str(10240 * MIB)
    assert value(p1 / "dmem.min", REGIONS[1]) == str(10240 * MIB)
    assert value(p1.parent / "dmem.min", REGIONS[1]) == str(10240 * MIB)  # kubepods/burstable
    assert value(p1.parent.parent / "dmem.min", REGIONS[1]) == str(10240 * MIB)  # kubepods

    # A claim shared by p1 and p2, whose cgroup is not there yet: p1 is held to both its lanes; no pod is
    # guaranteed a shared lane (their protections would add up past it).
    api.claims[("ml", "shared")] = claim(
        "shared", "claim-2", [result("gpu-0", "2Gi", "20")], [("p1", uid(1)), ("p2", uid(2))]
    )
    assert await prepare(dra_cfg, "shared", "claim-2") == ""
    assert value(p1 / "dmem.max", REGIONS[0]) == str(2048 * MIB)
    assert value(p1 / "dmem.min", REGIONS[0]) == "0"
    # p2 starts later: the agent's round writes its limit
    p2 = tree.pod(root, uid(2), driver="cgroupfs", qos="besteffort")
    await until(lambda: value(p2 / "dmem.max", REGIONS[0]) == str(2048 * MIB), "p2's limit from the round")

    # The first claim goes: p1's guarantee on GPU 1 is released and its ancestors lowered.
    channel, stub = dra_stub(dra_cfg)
    async with channel:
        got = await stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ml", name="solo", uid="claim-1")]
            ),
            timeout=DEADLINE_S,
        )
    assert got.claims["claim-1"].error == ""
    assert value(p1 / "dmem.min", REGIONS[1]) == "0"
    assert value(p1.parent.parent / "dmem.min", REGIONS[1]) == "0"


async def test_required_prepare_for_a_pod_without_a_cgroup_fails_with_the_reason(
    dra_agent: tuple[NodeAgent, FakeDraApi, Path], dra_cfg: AgentConfig
) -> None:
    _, api, _ = dra_agent
    api.claims[("ml", "c")] = claim("c", "claim-3", [result("gpu-0", "1Gi", "10")], [("p3", uid(3))])
    error = await prepare(dra_cfg, "c", "claim-3")
    assert (
        error
        == f"claim claim-3: pod {uid(3)} has no pod cgroup under {dra_cfg.mps_root.parent / 'sys-fs-cgroup'}"
    )
    assert not (dra_cfg.mps_root / "lanes" / "claim-3").exists()  # nothing left set up for it
