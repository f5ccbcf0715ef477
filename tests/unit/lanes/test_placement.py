"""GPU fit, Orion interference rules and the four scores."""

from __future__ import annotations

import pytest
from tessera.policy.lanes.placement import (
    Choice,
    GpuRequest,
    GpuState,
    PlacementConfig,
    PlacementError,
    Tenant,
    choose_gpus,
    complementarity,
    gpu_scores,
    to_priority,
    why_not,
)

CFG = PlacementConfig()


def _gpu(i: int, *tenants: Tenant, mem: int = 16000) -> GpuState:
    return GpuState(i, f"GPU-{i}", mem, tenants=list(tenants))


def test_complementary_profiles_score_highest() -> None:
    assert complementarity(1.0, 0.0) == 1.0  # compute-bound with memory-bound (Conv2d-BN2d)
    assert complementarity(1.0, 1.0) == 0.0
    compute_gpu = _gpu(0, Tenant(4000, 40, 1.0))
    memory_gpu = _gpu(1, Tenant(4000, 40, 0.0))
    req = GpuRequest(1, 4000, 30, compute_fraction=0.0)
    assert (
        gpu_scores(compute_gpu, req, CFG)["interference"] > gpu_scores(memory_gpu, req, CFG)["interference"]
    )
    cfg = PlacementConfig(weights=(("interference", 1.0),))
    choice = choose_gpus([compute_gpu, memory_gpu], req, cfg)
    assert isinstance(choice, Choice) and choice.gpu_indices == (0,)


def test_best_effort_never_takes_latency_critical_below_its_share() -> None:
    cfg = PlacementConfig(best_effort_overcommit=2.0)
    lc = _gpu(0, Tenant(4000, 70, 1.0, "latency-critical"))
    be_only = _gpu(1, Tenant(4000, 70, 1.0))
    req = GpuRequest(1, 2000, 40)
    reason = why_not(lc, req, cfg)
    assert reason is not None and "latency-critical lane below its share" in reason
    assert why_not(be_only, req, cfg) is None  # BE-only GPUs may overcommit
    assert "latency-critical" in (
        why_not(lc, GpuRequest(1, 100, 10, workload_class="latency-critical"), cfg) or ""
    )


def test_binpack_and_spread_disagree() -> None:
    busy, idle = _gpu(0, Tenant(8000, 50)), _gpu(1)
    req = GpuRequest(1, 2000, 20)
    pack = choose_gpus([busy, idle], req, PlacementConfig(weights=(("binpack", 1.0),)))
    spread = choose_gpus([busy, idle], req, PlacementConfig(weights=(("spread", 1.0),)))
    assert isinstance(pack, Choice) and pack.gpu_indices == (0,)
    assert isinstance(spread, Choice) and spread.gpu_indices == (1,)


def test_fragmentation_penalises_slivers_when_enabled_and_breaking_whole_gpus() -> None:
    cfg = PlacementConfig(sliver_fraction=0.1)
    gpu = _gpu(0, Tenant(8000, 50))
    sliver = gpu_scores(gpu, GpuRequest(1, 7500, 45), cfg)["fragmentation"]  # leaves 500 MiB / 5%
    exact = gpu_scores(gpu, GpuRequest(1, 8000, 50), cfg)["fragmentation"]  # fills both exactly
    assert exact == 1.0 and sliver < exact
    assert gpu_scores(gpu, GpuRequest(1, 7500, 45), CFG)["fragmentation"] == 1.0  # off by default
    broken = gpu_scores(_gpu(1), GpuRequest(1, 4000, 25), CFG)["fragmentation"]
    whole = gpu_scores(_gpu(1), GpuRequest(1, 16000, 100), CFG)["fragmentation"]
    assert broken < whole == 1.0


def test_reasons_and_placement_pins() -> None:
    gpus = [_gpu(0, Tenant(15000, 10)), _gpu(1), GpuState(2, "GPU-2", 16000, healthy=False)]
    out = choose_gpus(gpus, GpuRequest(3, 2000, 10), CFG)
    assert isinstance(out, str) and "1 of 3 GPUs fit" in out and "unhealthy" in out
    pinned = choose_gpus(gpus, GpuRequest(1, 2000, 10), CFG, only=[0])
    assert isinstance(pinned, str) and "1000 MiB free" in pinned
    assert choose_gpus(gpus, GpuRequest(1, 2000, 10), CFG, only=[7]) == (
        "placement names GPU index 7, which the node does not have"
    )


def test_priority_range_and_bad_input() -> None:
    assert [to_priority(x) for x in (0.0, 0.44, 1.0, 1.7)] == [0, 4, 10, 10]
    with pytest.raises(PlacementError):
        GpuRequest(0, 100, 10)
    with pytest.raises(PlacementError, match="unknown scoring strategy"):
        PlacementConfig(weights=(("magic", 1.0),))  # type: ignore[arg-type]
