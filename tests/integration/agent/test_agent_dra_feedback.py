"""The BE feedback loop with DRA lanes (issue 39), the whole agent running (`NodeAgent`, `lanes_api="dra"`): the
test plays the kubelet on the DRA socket and the API server behind `FakeDraApi`, as `test_agent_hpbe.py` plays
it on the device-plugin socket. Lanes are claims: an HP claim (its `LaneConfig` says latency-critical) and two
BE claims on one GPU, each claim's MPS daemon the fake control binary. The HP pod's progress reports time its
claim's lane; the loop learns its p99 alone, then lowers the BE share when the reports slow down: the BE
claims' CDI specs and daemons take the new share, only the checkpointing BE pod is restarted (its claim read
again first), and events and metrics name the pods, never the claims."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from tessera.api import contract
from tessera.sdk import report_progress
from tessera_agent.agent import NodeAgent
from tessera_agent.config import AgentConfig
from tessera_agent.enforce import mps_v3
from tessera_agent.enforce.lane_daemons import LaneDaemons
from tessera_agent.enforce.lane_dirs import LaneDirs
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.allocate import progress_endpoint
from tessera_agent.kubelet.dra_lanes import cdi_spec_path
from tessera_agent.lanes.book import PodLane
from tessera_agent.lanes.interference import REASON_CHANGED, REASON_NOT_RESTARTED, WindowedLatency
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod, StaticPodSource, pod_info_from_manifest
from tessera_agent.proto import dra_v1_pb2, dra_v1_pb2_grpc

from .test_agent_dra import DEADLINE_S, NODE, FakeDraApi, claim, result
from .test_agent_dra_lanes import FAKE_MPS, lane_config
from .waiting import until


@dataclass
class Recorder:
    restarts: list[PodLane] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    async def restart(self, lane: PodLane, reason: str) -> None:
        self.restarts.append(lane)

    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((pod, reason, message))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, **annotations: str) -> NodePod:
    """A pod as the API server lists it in DRA mode: no tessera.io/assignment."""
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations}
    return pod_info_from_manifest({"metadata": meta, "spec": {"nodeName": NODE}})


def lane_claim(name: str, uid: str, memory: str, compute: str, *configs: dict[str, Any]) -> dict[str, Any]:
    """A claim on gpu-0 reserved for the pod of the same name."""
    c = claim(name, uid, [result("gpu-0", memory, compute)], pod=name)
    c["status"]["allocation"]["devices"]["config"] = list(configs)
    return c


@dataclass
class Running:
    agent: NodeAgent
    api: FakeDraApi
    cfg: AgentConfig
    pods: StaticPodSource
    rec: Recorder
    clock: Clock
    iterations: int = 0

    async def prepare(self, name: str, uid: str) -> str:
        """NodePrepareResources for one claim, as the kubelet sends it; the error, "" when prepared."""
        async with grpc.aio.insecure_channel(f"unix://{self.cfg.dra_socket}") as channel:
            resp = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=uid)]
                )
            )
        return str(resp.claims[uid].error)

    async def unprepare(self, name: str, uid: str) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.cfg.dra_socket}") as channel:
            await dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=uid)]
                )
            )

    def env(self, uid: str) -> dict[str, str]:
        spec = json.loads(cdi_spec_path(self.cfg.cdi_dir, uid).read_text())
        return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])

    def told(self, uid: str) -> list[str]:
        log = self.cfg.mps_root / "lanes" / uid / "pipe" / "commands.log"
        return [line.split(" ", 1)[1] for line in log.read_text().splitlines()]

    async def hp_iterations(self, n: int, seconds_each: float) -> None:
        assert self.cfg.progress_socket is not None
        endpoint = progress_endpoint(str(self.cfg.progress_socket), "ml", "serve")
        for _ in range(n):
            self.clock.now += seconds_each
            self.iterations += 1
            await asyncio.to_thread(report_progress, self.iterations, None, endpoint=endpoint)


@pytest.fixture
async def running(plugin_dir: Path) -> AsyncIterator[Running]:
    cfg = AgentConfig(
        node_name=NODE,
        lanes_api="dra",
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        progress_socket=plugin_dir / "progress.sock",
        peer_check=False,  # one test process stands in for every pod
        hp_be_lanes=True,
        be_percent=50,
        be_feedback=True,
        be_min_interval_s=300,
        be_step_interval_s=0.05,
    )
    pods = StaticPodSource([pod("serve")])
    rec, clock = Recorder(), Clock()
    agent = NodeAgent(
        cfg,
        FakeGpuBackend.uniform(1),
        pods,
        None,
        AgentMetrics(),
        daemons=LaneDaemons(LaneDirs(cfg.mps_root), binary=FAKE_MPS),
        sample_interval_s=0.05,
        restarter=rec,
        events=rec,
        dra=FakeDraApi(),
        clock=clock,
    )
    assert isinstance(agent.dra, FakeDraApi) and cfg.progress_socket is not None
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await until(
        lambda: cfg.dra_registration_socket.exists() and cfg.progress_socket.exists(),  # type: ignore[union-attr]
        "the agent's DRA and progress sockets",
    )
    yield Running(agent, agent.dra, cfg, pods, rec, clock)
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)


async def test_the_loop_lowers_the_be_share_of_claims_and_restarts_the_pod_that_checkpoints(
    running: Running,
) -> None:
    r, agent = running, running.agent
    assert agent.loop is not None and agent.lanes is not None
    (gpu,) = agent.lanes.usable_mib
    r.api.claims[("ml", "serve")] = lane_claim(
        "serve", "claim-hp", "8Gi", "40", lane_config("latency-critical")
    )
    assert await r.prepare("serve", "claim-hp") == ""
    env = r.env("claim-hp")
    assert (env[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE], env[contract.ENV_MPS_CLIENT_PRIORITY]) == (
        "100",
        "0",
    )

    # The HP claim's lane alone: its pod's iteration time (10 ms) becomes the GPU's dedicated p99.
    await r.hp_iterations(30, 0.010)
    await until(lambda: gpu in agent.loop.p99_dedicated, "the dedicated p99")  # type: ignore[union-attr]
    assert agent.loop.p99_dedicated[gpu] == pytest.approx(0.010)
    latency = agent.loop.latency
    assert isinstance(latency, WindowedLatency)
    latency.reset(gpu)  # as in test_agent_hpbe.py: no step may read the alone-time samples as shared ones

    r.pods.pods = [
        *r.pods.pods,
        pod("train", **{contract.ANN_CHECKPOINTS: "true"}),
        pod("batch"),
    ]
    for name in ("train", "batch"):  # no configuration: best-effort
        r.api.claims[("ml", name)] = lane_claim(name, f"claim-{name}", "4Gi", "50")
        assert await r.prepare(name, f"claim-{name}") == ""
        env = r.env(f"claim-{name}")
        assert (env[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE], env[contract.ENV_MPS_CLIENT_PRIORITY]) == (
            "50",
            "1",
        )
    # The agent's sampling rounds see the pods of each claim, and keep the claims' lanes in the book: a
    # second HP claim on the GPU is still refused after them.
    claims = agent._claims
    assert claims is not None
    await until(
        lambda: (
            [p.pod for ln in agent.lanes.on_gpu(gpu) for p in claims.pods_of(ln)]  # type: ignore[union-attr]
            == ["ml/serve", "ml/train", "ml/batch"]
        ),
        "a sampling round with the BE pods",
    )
    r.api.claims[("ml", "serve-2")] = lane_claim(
        "serve-2", "claim-hp2", "1Gi", "10", lane_config("latency-critical")
    )
    assert "already has a high-priority lane (claim ml/serve)" in await r.prepare("serve-2", "claim-hp2")

    # Shared: the HP iterations slow to 16 ms, over the 11.5 ms target; the loop lowers the BE share.
    await r.hp_iterations(30, 0.016)
    await until(lambda: r.rec.restarts != [], "a BE restart")
    share = agent.lanes.be_percent_of(gpu)
    assert share < 50
    (restarted,) = r.rec.restarts  # the BE pod that checkpoints, only, as itself and in its claim's lane
    assert (restarted.pod, restarted.uid, restarted.claim) == ("ml/train", "uid-train", "claim-train")
    reasons = {(p, why) for p, why, _ in r.rec.events}
    assert ("ml/train", REASON_CHANGED) in reasons and ("ml/batch", REASON_NOT_RESTARTED) in reasons
    assert all(p in ("ml/train", "ml/batch") for p, _, _ in r.rec.events)  # pods, never the claims, never HP

    # Both BE claims hold the new share where a new container and a new MPS server read it.
    for uid in ("claim-train", "claim-batch"):
        assert r.env(uid)[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == str(share)
        sets = [c for c in r.told(uid) if c.startswith("set_")]  # not the health checks between them
        assert sets[-3:] == [  # the daemon's defaults again, with the new share
            f"set_default_active_thread_percentage {share}",
            "set_default_device_pinned_mem_limit 0 4096M",
            "set_default_client_priority 1",
        ]
    assert r.env("claim-hp")[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "100"
    text = generate_latest(agent.metrics.registry).decode()
    assert f'tessera_lane_be_compute_ratio{{node="{NODE}",uuid="{gpu}"}} {share / 100}' in text
    assert f'tessera_lane_be_restarts_total{{node="{NODE}",reason=' in text

    # The restarted pod's replacement: a claim from a template is a new claim, prepared with the new share;
    # a standalone claim prepared again (its pods all ended) gets it too.
    r.api.claims[("ml", "train-2")] = lane_claim("train-2", "claim-train-2", "4Gi", "50")
    assert await r.prepare("train-2", "claim-train-2") == ""
    assert r.env("claim-train-2")[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == str(share)
    await r.unprepare("train", "claim-train")
    assert await r.prepare("train", "claim-train") == ""
    assert r.env("claim-train")[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == str(share)
    assert f"set_default_active_thread_percentage {share}" in r.told("claim-train")


async def test_with_mps_v3_a_prepared_claims_namespace_takes_the_new_share_and_keeps_it_across_a_restart(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new BE share reaches a claim that stays prepared under MPS v3 too: its namespace's active-thread
    percentage, which the daemon, restarted after a crash, sets up again with the new share."""
    from tessera_agent.gpus.backend import usable_memory_mib
    from tessera_agent.kubelet.dra_plugin import DraServicer
    from tessera_agent.lanes.book import LaneBook

    from .test_agent_lane_enforcement import alive
    from .test_agent_mps_v3 import v3_cli

    monkeypatch.setenv("FAKE_MPS_PROTOCOLS", "2,3")  # a driver that offers v3 namespaces
    cfg = AgentConfig(
        node_name=NODE,
        lanes_api="dra",
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        hp_be_lanes=True,
        mps_protocol="v3",
    )
    backend = FakeGpuBackend.uniform(1)
    (gpu,) = [g.uuid for g in backend.gpus()]
    book = LaneBook({g.uuid: usable_memory_mib(g) for g in backend.gpus()}, default_be_percent=50)
    daemons = LaneDaemons(
        LaneDirs(cfg.mps_root), binary=FAKE_MPS, check_interval_s=0.2, layout=cfg.lane_layout()
    )
    api = FakeDraApi()
    s = DraServicer(cfg, backend, api, daemons, book)
    api.claims[("ml", "train")] = lane_claim("train", "claim-train", "4Gi", "60")
    try:
        await s.prepare("ml", "train", "claim-train")
        pipe = cfg.mps_root / "lanes" / "claim-train" / "pipe"
        ns = mps_v3.namespace_name("claim-train")

        def share() -> str:
            return v3_cli(pipe, "namespace", "get", ns, "tessera", "active-thread-percentage")

        assert share() == "50"
        book.set_be_percent(gpu, 30)
        await s.apply_be_share(gpu, 30)
        assert s.unshared == {} and share() == "30"
        spec = json.loads(cdi_spec_path(cfg.cdi_dir, "claim-train").read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "30"

        first = json.loads((pipe / "daemon.json").read_text())["pid"]
        os.kill(first, signal.SIGKILL)
        await until(lambda: not alive(first), "the daemon exiting")

        def set_up_again() -> bool:
            try:
                pid = json.loads((pipe / "daemon.json").read_text())["pid"]
                return bool(pid != first and share() == "30")
            except (
                AssertionError,
                OSError,
                ValueError,
            ):  # the new daemon, its server or namespace not there yet
                return False

        await until(set_up_again, "the daemon back with the claim's namespace at the new share")
    finally:
        await daemons.close()
