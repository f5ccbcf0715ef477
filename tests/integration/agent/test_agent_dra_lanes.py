"""HP and BE lanes keyed by claim in DRA mode (issue 39): a claim's class from its opaque configuration for
`gpu.tessera.io`, one HP lane per GPU, the class's active-thread share and MPS client priority in the CDI env and
held server-side by the claim's own MPS daemon (the fake control binary records what it is told)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.enforce.lane_daemons import LaneDaemons
from tessera_agent.enforce.lane_dirs import LaneDirs
from tessera_agent.gpus.backend import usable_memory_mib
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_lanes import ClaimError, cdi_spec_path
from tessera_agent.kubelet.dra_plugin import DraServicer
from tessera_agent.lanes.book import LaneBook

from .test_agent_dra import NODE, FakeDraApi, claim, result

FAKE_MPS = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")


def lane_config(klass: str, **extra: Any) -> dict[str, Any]:
    params = {"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "LaneConfig", "class": klass, **extra}
    return {
        "source": "FromClaim",
        "requests": ["gpu"],
        "opaque": {"driver": contract.DRA_DRIVER, "parameters": params},
    }


def configured(
    name: str, uid: str, device: str, memory: str, compute: str, *configs: dict[str, Any]
) -> dict[str, Any]:
    c = claim(name, uid, [result(device, memory, compute)], pod=name)
    c["status"]["allocation"]["devices"]["config"] = list(configs)
    return c


@pytest.fixture
async def servicer(plugin_dir: Path) -> AsyncIterator[tuple[DraServicer, FakeDraApi, FakeGpuBackend]]:
    cfg = AgentConfig(
        node_name=NODE,
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        lanes_api="dra",
        hp_be_lanes=True,
        be_percent=50,
    )
    backend = FakeGpuBackend.uniform(2)
    api = FakeDraApi()
    book = LaneBook({g.uuid: usable_memory_mib(g) for g in backend.gpus()}, default_be_percent=cfg.be_percent)
    daemons = LaneDaemons(LaneDirs(cfg.mps_root), binary=FAKE_MPS)
    s = DraServicer(cfg, backend, api, daemons, book)
    yield s, api, backend
    await daemons.close()


def env_of(s: DraServicer, uid: str) -> dict[str, str]:
    spec = json.loads(cdi_spec_path(s.cfg.cdi_dir, uid).read_text())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def told(s: DraServicer, uid: str) -> list[str]:
    log = s.daemons.dirs.paths(uid).pipe / "commands.log"
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


async def test_a_claims_class_sets_its_share_and_priority_and_one_hp_lane_per_gpu(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend],
) -> None:
    s, api, _ = servicer
    api.claims[("ml", "serve")] = configured(
        "serve", "uid-hp", "gpu-0", "8Gi", "40", lane_config("latency-critical")
    )
    await s.prepare("ml", "serve", "uid-hp")
    env = env_of(s, "uid-hp")
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_CLIENT_PRIORITY"]) == ("100", "0")
    assert told(s, "uid-hp")[1:] == [
        "set_default_active_thread_percentage 100",
        "set_default_device_pinned_mem_limit 0 8192M",
        "set_default_client_priority 0",
    ]
    # A claim with no configuration is best-effort, its share capped at the GPU's BE percentage.
    api.claims[("ml", "train")] = configured("train", "uid-be", "gpu-0", "8Gi", "60")
    await s.prepare("ml", "train", "uid-be")
    env = env_of(s, "uid-be")
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_CLIENT_PRIORITY"]) == ("50", "1")
    assert "set_default_client_priority 1" in told(s, "uid-be")
    # A second HP claim on the same GPU is refused with the reason; on the other GPU it is admitted.
    api.claims[("ml", "serve-2")] = configured(
        "serve-2", "uid-hp2", "gpu-0", "4Gi", "20", lane_config("latency-critical")
    )
    with pytest.raises(
        ClaimError, match=r"already has a high-priority lane \(claim ml/serve\); at most one per GPU"
    ):
        await s.prepare("ml", "serve-2", "uid-hp2")
    assert not s.daemons.dirs.paths("uid-hp2").root.exists()  # nothing set up for a refused claim
    api.claims[("ml", "serve-3")] = configured(
        "serve-3", "uid-hp3", "gpu-1", "4Gi", "20", lane_config("latency-critical")
    )
    await s.prepare("ml", "serve-3", "uid-hp3")
    # Once the first HP claim is unprepared, its GPU takes another.
    await s.unprepare("uid-hp")
    await s.prepare("ml", "serve-2", "uid-hp2")
    assert env_of(s, "uid-hp2")["CUDA_MPS_CLIENT_PRIORITY"] == "0"


@pytest.mark.parametrize(
    ("configs", "why"),
    [
        ([lane_config("urgent")], "class: must be one of 'latency-critical' or 'best-effort'"),
        ([lane_config("best-effort", priority=3)], "priority: unknown field"),
        (
            [lane_config("best-effort"), lane_config("latency-critical")],
            "its configurations name both lane classes",
        ),
    ],
)
async def test_a_configuration_the_driver_cannot_read_refuses_the_claim_with_the_reason(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend], configs: list[dict[str, Any]], why: str
) -> None:
    s, api, _ = servicer
    api.claims[("ml", "x")] = configured("x", "uid-x", "gpu-0", "1Gi", "10", *configs)
    with pytest.raises(ClaimError, match=rf"^claim uid-x: .*{why}") as err:
        await s.prepare("ml", "x", "uid-x")
    assert "\n" not in str(err.value)


async def test_another_drivers_configuration_is_not_read(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend],
) -> None:
    s, api, _ = servicer
    other = {"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "MPS"}}}
    api.claims[("ml", "y")] = configured("y", "uid-y", "gpu-0", "1Gi", "10", other)
    await s.prepare("ml", "y", "uid-y")
    assert env_of(s, "uid-y")["CUDA_MPS_CLIENT_PRIORITY"] == "1"  # no class of ours: best-effort


async def test_a_claims_lane_is_measured_for_the_pod_it_is_reserved_for(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend],
) -> None:
    """Per-lane telemetry keyed by claim: the pod's processes count against its claim's lane and limits."""
    from prometheus_client import generate_latest
    from tessera_agent.gpus.telemetry import LaneTelemetry
    from tessera_agent.metrics_factory import AgentMetrics
    from tessera_agent.pods import pod_info_from_manifest

    s, api, backend = servicer
    api.claims[("ml", "serve")] = configured(
        "serve", "uid-hp", "gpu-1", "8Gi", "40", lane_config("latency-critical")
    )
    await s.prepare("ml", "serve", "uid-hp")
    pod = pod_info_from_manifest(
        {"metadata": {"name": "serve", "namespace": "ml", "uid": "uid-serve"}, "spec": {}}
    )
    gpu1 = backend.gpus()[1].uuid
    backend.add_process(gpu1, 4242, 9000, sm_util=30)  # past its 8 GiB
    metrics = AgentMetrics()
    telemetry = LaneTelemetry(NODE, backend, metrics, resolve_pid={4242: "uid-serve"}.get)
    over = telemetry.update([pod], s.held_lanes([pod]))
    assert [(o.lane, o.pod, o.memory_limit_bytes // 2**20) for o in over] == [("uid-hp", "serve", 8192)]
    text = generate_latest(metrics.registry).decode()
    labels = f'gpu="1",lane="uid-hp",namespace="ml",node="{NODE}",pod="serve"'
    assert f"tessera_lane_compute_limit_ratio{{{labels}}} 1.0" in text  # HP: all threads
    assert f"tessera_lane_over_limit{{{labels}}} 1.0" in text
    await s.unprepare("uid-hp")
    assert s.held_lanes([pod]) == []


async def test_a_claims_lane_is_joined_on_the_coordinator_only_by_the_pods_it_is_reserved_for(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend], plugin_dir: Path
) -> None:
    """The lane coordinator's peer check in DRA mode: a pod's lanes are the claims prepared for it."""
    import os

    from tessera_agent.lanes.coordinator import LaneCoordinator
    from tessera_agent.lanes.peers import PeerResolver
    from tessera_agent.pods import StaticPodSource, pod_info_from_manifest

    from .peer_support import FakeProc, Peer, pod_uid

    s, api, _ = servicer
    holder, other = pod_uid(1), pod_uid(2)
    c = configured("train", "uid-c", "gpu-0", "2Gi", "20")
    c["status"]["reservedFor"] = [{"resource": "pods", "name": "train", "uid": holder}]
    api.claims[("ml", "train")] = c
    await s.prepare("ml", "train", "uid-c")
    pods = StaticPodSource(
        [
            pod_info_from_manifest(
                {"metadata": {"namespace": "ml", "name": n, "uid": u}, "spec": {"nodeName": NODE}}
            )
            for n, u in (("train", holder), ("other", other))
        ]
    )
    fake = FakeProc(plugin_dir / "proc")
    coordinator = LaneCoordinator(
        plugin_dir / "coord.sock",
        peers=PeerResolver(NODE, pods, proc_root=fake.root),
        socket_group=os.getgid(),
        lanes_held=lambda pod: s.lanes_held(pod.namespace, pod.uid),
    )
    await coordinator.start()
    started: list[Peer] = []
    try:
        for uid in (holder, other):
            started.append(await Peer.start(fake, uid))  # type: ignore[arg-type]
            assert (await started[-1].ask(f"connect {coordinator.socket_path}"))["connected"]
        joined = await started[0].send({"op": "join", "lane": "uid-c", "job": "trainer"})
        assert joined["ok"], joined
        refused = await started[1].send({"op": "join", "lane": "uid-c", "job": "trainer"})
        assert not refused["ok"] and "may join only its own lane (none), not 'uid-c'" in refused["error"], (
            refused
        )
    finally:
        for p in started:
            await p.close()
        await coordinator.stop()


async def test_a_restarted_driver_keeps_the_hp_lane_it_prepared_before(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend],
) -> None:
    """The lane book is rebuilt from the checkpoint: after a restart a second HP claim on the GPU is still
    refused, and the first claim's daemon runs again with its class's limits."""
    s, api, backend = servicer
    api.claims[("ml", "serve")] = configured(
        "serve", "uid-hp", "gpu-0", "8Gi", "40", lane_config("latency-critical")
    )
    await s.prepare("ml", "serve", "uid-hp")
    await s.daemons.close()  # the agent's exit ends its daemons
    book = LaneBook({g.uuid: usable_memory_mib(g) for g in backend.gpus()}, default_be_percent=50)
    again = DraServicer(s.cfg, backend, api, LaneDaemons(LaneDirs(s.cfg.mps_root), binary=FAKE_MPS), book)
    try:
        await again.restore_lanes()
        assert again.daemons.running("uid-hp") is not None
        assert "set_default_client_priority 0" in told(again, "uid-hp")[-3:]
        api.claims[("ml", "serve-2")] = configured(
            "serve-2", "uid-hp2", "gpu-0", "4Gi", "20", lane_config("latency-critical")
        )
        with pytest.raises(ClaimError, match="already has a high-priority lane"):
            await again.prepare("ml", "serve-2", "uid-hp2")
    finally:
        await again.daemons.close()


async def test_a_claims_containers_are_given_the_coordinator_socket_as_allocate_gives_it(
    servicer: tuple[DraServicer, FakeDraApi, FakeGpuBackend], plugin_dir: Path
) -> None:
    """The coordinator in DRA mode is reachable from the claim's containers: its socket's directory mounted and
    TESSERA_COORDINATOR_SOCKET naming it, as the device plugin's Allocate hands them out."""
    s, api, backend = servicer
    cfg = s.cfg.model_copy(update={"coordinator_socket": plugin_dir / "coord" / "coordinator.sock"})
    with_coordinator = DraServicer(cfg, backend, api, lanes=s.lanes)
    api.claims[("ml", "train")] = configured("train", "uid-c", "gpu-0", "2Gi", "20")
    await with_coordinator.prepare("ml", "train", "uid-c")
    env = env_of(with_coordinator, "uid-c")
    assert env[contract.ENV_COORDINATOR_SOCKET] == "/run/tessera/coordinator/coordinator.sock"
    spec = json.loads(cdi_spec_path(cfg.cdi_dir, "uid-c").read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]}
    assert mounts["/run/tessera/coordinator"] == str(plugin_dir / "coord")
    # without a coordinator socket, neither (the lane's other claims in this file)
    api.claims[("ml", "plain")] = configured("plain", "uid-p", "gpu-1", "2Gi", "20")
    await s.prepare("ml", "plain", "uid-p")
    assert contract.ENV_COORDINATOR_SOCKET not in env_of(s, "uid-p")
