"""Each lane enforced by the node (issue 39): its own MPS daemon with its limits set server-side, its own pipe
directory and /dev/shm, and its GPUs' device nodes, from a real `tessera-agent` process (fake GPUs, the fake
MPS control binary, a fake kubelet calling Allocate over the device plugin's gRPC socket).

The commands the agent sends are checked against the syntax NVIDIA documents for `nvidia-cuda-mps-control`
(docs.nvidia.com/deploy/mps, "Legacy MPS v2 Interface"), not against the agent's own code.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tessera_agent.proto import api_pb2, api_pb2_grpc

from .agent_fake_kubelet import FakeKubelet
from .waiting import until

FAKE_MPS = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")
UUIDS = [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(2)]  # FakeGpuBackend.uniform's

# The control commands' syntax as NVIDIA documents it: a percentage; a device (ordinal or UUID) and an
# integer with an M or G suffix; a priority 0 or 1.
DOCUMENTED = [
    re.compile(r"set_default_active_thread_percentage (100|[1-9][0-9]?)"),
    re.compile(r"set_default_device_pinned_mem_limit (\d+|GPU-[0-9a-f-]+) \d+[MG]"),
    re.compile(r"set_default_client_priority [01]"),
    re.compile(r"get_default_active_thread_percentage"),
    re.compile(r"get_default_device_pinned_mem_limit (\d+|GPU-[0-9a-f-]+)"),
    re.compile(r"quit"),
    re.compile(r"-d"),
]


def lane_pod(name: str, gpu: int, mib: int, pct: int) -> dict[str, Any]:
    assignment = {
        "node": "n1",
        "gpuUUIDs": [UUIDS[gpu]],
        "gpuIndices": [gpu],
        "laneId": f"lane-{name}",
        "memoryMiB": mib,
        "computePercent": pct,
    }
    return {
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": f"uid-{name}",
            "annotations": {"tessera.io/assignment": json.dumps(assignment)},
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"tessera.io/gpu": "1"}}}]},
    }


def recorded(pipe: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in (pipe / "commands.log").read_text().splitlines()]


def ask(pipe: Path, command: str) -> str:
    """What the lane's daemon answers, asked as an admin would: through the control binary and the lane's pipe."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    out = subprocess.run(
        [FAKE_MPS], input=command + "\n", env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
async def agent(plugin_dir: Path, kubelet: FakeKubelet) -> AsyncIterator[asyncio.subprocess.Process]:
    (plugin_dir / "pods.json").write_text(json.dumps([lane_pod("a", 1, 4096, 30)]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        *("--node", "n1", "--fake-gpus", "2", "--fake-pods", str(plugin_dir / "pods.json")),
        *("--device-plugin-dir", str(plugin_dir), "--mps-root", str(plugin_dir / "mps")),
        *("--mps-binary", FAKE_MPS, "--metrics-port", "0", "--sample-interval", "0.5"),
    )
    try:
        await asyncio.wait_for(kubelet.registered.wait(), 30)
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)


async def allocate(kubelet: FakeKubelet, device: str) -> api_pb2.ContainerAllocateResponse:
    async with kubelet.plugin_channel() as ch:
        stub = api_pb2_grpc.DevicePluginStub(ch)
        resp = await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device])]
            )
        )
    (c,) = resp.container_responses
    return c


async def test_a_lane_gets_its_own_daemon_with_its_limits_its_own_dirs_and_its_gpus_nodes(
    agent: asyncio.subprocess.Process, plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    c = await allocate(kubelet, f"{UUIDS[1]}::0")
    lane = plugin_dir / "mps" / "lanes" / "uid-a"
    # The container's mounts are the lane's own pipe directory and /dev/shm, nothing node-wide.
    assert {(m.container_path, m.host_path) for m in c.mounts} == {
        ("/mps/pipe", str(lane / "pipe")),
        ("/dev/shm", str(lane / "shm")),
    }
    assert not (plugin_dir / "mps" / "pipe").exists() and not (plugin_dir / "mps" / "shm").exists()
    # Its GPU's device node and the driver's control nodes, and no other GPU's.
    assert [(d.container_path, d.host_path, d.permissions) for d in c.devices] == [
        ("/dev/nvidia1", "/dev/nvidia1", "rw"),
        ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools", "rw"),
    ]

    # The lane's daemon was started before Allocate answered, sees only the lane's GPU, and holds the
    # lane's limits as its defaults: what the container's env says can only lower them.
    daemon = json.loads((lane / "pipe" / "daemon.json").read_text())
    assert daemon["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    sent = recorded(lane / "pipe")
    assert sent[:3] == [
        "-d",
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 4096M",
    ]
    assert all(any(p.fullmatch(cmd) for p in DOCUMENTED) for cmd in sent), sent
    assert ask(lane / "pipe", "get_default_device_pinned_mem_limit 0") == "4096M"
    assert ask(lane / "pipe", "get_default_active_thread_percentage") == "30.0"
    # Its server's shared memory is the lane's /dev/shm, not the host's.
    assert (lane / "shm" / f"fake-mps-{daemon['pid']}").exists()
    assert not Path(f"/dev/shm/fake-mps-{daemon['pid']}").exists()

    # A tenant that raises its env changes nothing the daemon holds.
    assert dict(c.envs)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert ask(lane / "pipe", "get_default_device_pinned_mem_limit 0") == "4096M"

    agent.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(agent.wait(), 30) == 0
    assert recorded(lane / "pipe")[-1] == "quit"  # asked to quit, never killed (MPS guide §3.3)
    await until(lambda: not alive(daemon["pid"]), "the lane's daemon exiting")


class AbortContext:
    """What grpc.aio gives a servicer, as far as Allocate uses it: abort raises with the reason."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code.name}: {details}")


def servicer(root: Path, binary: str, pods: list[dict[str, Any]]) -> tuple[Any, Any]:
    from tessera_agent.config import AgentConfig
    from tessera_agent.enforce.lane_daemons import LaneDaemons
    from tessera_agent.enforce.lane_dirs import LaneDirs
    from tessera_agent.gpus.fake_backend import FakeGpuBackend
    from tessera_agent.kubelet.plugin import DevicePluginServicer
    from tessera_agent.pods import StaticPodSource, pod_info_from_manifest

    cfg = AgentConfig(node_name="n1", mps_root=root / "mps")
    source = StaticPodSource([pod_info_from_manifest(m) for m in pods])
    daemons = LaneDaemons(LaneDirs(cfg.mps_root), binary=binary, check_interval_s=0.2)
    return DevicePluginServicer(cfg, FakeGpuBackend.uniform(2), source, daemons=daemons), source


def request(device: str) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device])]
    )


def alive(pid: int) -> bool:
    """Running, not exited (a zombie whose reaper has not come yet counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_gone_pods_lane_is_released_and_a_restarted_agent_restarts_a_live_ones_daemon(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = plugin_dir / "record.log"
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))  # outlives the lane's pipe directory
    plugin, source = servicer(plugin_dir, FAKE_MPS, [lane_pod("a", 0, 2048, 40)])
    lanes = plugin_dir / "mps" / "lanes"
    try:
        listed_before = plugin.daemons.clock()
        await plugin.Allocate(request(f"{UUIDS[0]}::0"), AbortContext())
        a = json.loads((lanes / "uid-a" / "pipe" / "daemon.json").read_text())["pid"]
        # A lane set up after the pods were listed is kept, though its pod is missing from that listing.
        await plugin.keep_lanes([], listed_before)
        assert plugin.daemons.running("uid-a") is not None and (lanes / "uid-a").is_dir()
        # Gone from the node: its daemon is asked to quit and its directories removed.
        await plugin.keep_lanes([], plugin.daemons.clock())
        assert plugin.daemons.running("uid-a") is None and not (lanes / "uid-a").exists()
        await until(lambda: not alive(a), "the released lane's daemon exiting")
        assert record.read_text().splitlines()[-1].endswith(" quit")

        # An agent that restarts finds pod b allocated and its lane without a daemon: it starts one.
        from tessera_agent.pods import pod_info_from_manifest

        source.pods.append(pod_info_from_manifest(lane_pod("b", 1, 1024, 20)))  # bound after a: one at a time
        await plugin.Allocate(request(f"{UUIDS[1]}::0"), AbortContext())
        await plugin.daemons.close()
        restarted, _ = servicer(plugin_dir, FAKE_MPS, [])
        pods = await source.pods_on_node("n1")
        assert [p.allocated for p in pods if p.name == "b"] == [True]
        await restarted.keep_lanes(pods, restarted.daemons.clock())
        assert restarted.daemons.running("uid-b") is not None
        assert ask(lanes / "uid-b" / "pipe", "get_default_device_pinned_mem_limit 0") == "1024M"
        await restarted.daemons.close()
    finally:
        await plugin.daemons.close()


async def test_a_daemon_that_cannot_start_refuses_the_pod_with_the_reason(plugin_dir: Path) -> None:
    plugin, source = servicer(
        plugin_dir, str(plugin_dir / "no-such-mps-control"), [lane_pod("a", 0, 2048, 40)]
    )
    with pytest.raises(
        RuntimeError, match=r"FAILED_PRECONDITION: pod ml/a: its lane's MPS daemon did not start: "
    ):
        await plugin.Allocate(request(f"{UUIDS[0]}::0"), AbortContext())
    assert not (plugin_dir / "mps" / "lanes" / "uid-a").exists()  # nothing left behind
    assert [p.allocated for p in await source.pods_on_node("n1")] == [False]


async def test_without_the_mps_binary_the_agent_refuses_to_start_rather_than_run_unenforced(
    plugin_dir: Path,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        *("--node", "n1", "--fake-gpus", "1", "--device-plugin-dir", str(plugin_dir)),
        *("--mps-binary", str(plugin_dir / "nvidia-cuda-mps-control"), "--metrics-port", "0"),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    message = err.decode().strip()
    assert message.startswith("tessera-agent: ") and "nvidia-cuda-mps-control not found" in message, message
    assert "chart agent.enforcement: declaredOnly" in message and "Traceback" not in message


def test_the_enforcing_mechanism_of_each_limit_is_in_the_metrics() -> None:
    from tessera_agent.enforce.mechanism import mechanisms, report
    from tessera_agent.metrics_factory import AgentMetrics

    for mps, limit in ((True, "mps-daemon-per-lane"), (False, "declared-only")):
        metrics = AgentMetrics()
        report("n1", mechanisms(mps), metrics)
        got = {
            (s.labels["limit"], s.labels["mechanism"])
            for family in metrics.registry.collect()
            if family.name == "tessera_agent_lane_enforcement"
            for s in family.samples
            if s.value == 1
        }
        assert got == {
            ("memory", limit),
            ("compute", limit),
            ("isolation", "lane-directories"),
            ("devices", "device-nodes"),
        }
