"""Fluid reproduction on seeded workloads (Fluid, dissertation §3.6.2–3.6.3: Figs. 3.7, 3.10, 3.13a)."""

import functools

import pytest
from tessera.policy.fluid import FluidConfig
from tessera.sim.tuning.engine import TuningResult
from tessera.sim.tuning.experiments import (
    Speedup,
    grid_heights,
    packing_overhead_grid,
    packing_overhead_runs,
    paired_speedup,
    runs,
)

# Which config wins, and when it is sampled, varies a lot from seed to seed (a 5-seed mean of ASHA's
# time-to-target ratio moved from 1.04 to 1.10 at 200 seeds), so every figure is over 200 paired seeds.
SEEDS = range(200)


@functools.cache
def _runs(name: str, executor: str, gpus: int = 8, pack: int = 2, dynamic: bool = True) -> list[TuningResult]:
    fluid = FluidConfig(max_pack=pack, max_workers=4, dynamic=dynamic)
    return runs(name, executor, SEEDS, gpus, fluid=fluid)  # type: ignore[arg-type]


def speedup(name: str, metric: str, gpus: int = 8, pack: int = 2, dynamic: bool = True) -> Speedup:
    return paired_speedup(_runs(name, "fifo", gpus), _runs(name, "fluid", gpus, pack, dynamic), metric)


@pytest.mark.parametrize("name", ["hyperband", "syncbohb"])
@pytest.mark.parametrize("metric", ["makespan", "time_to_target"])
def test_synchronous_stage_based_gain_at_least_30_percent(name: str, metric: str) -> None:
    s = speedup(name, metric)
    assert s.low >= 1.3, f"{name} {metric}: {s}"


@pytest.mark.parametrize("name", ["asha", "bohb"])
def test_asynchronous_gain_at_least_10_percent_in_makespan(name: str) -> None:
    s = speedup(name, "makespan")
    assert s.low >= 1.1, f"{name}: {s}"


def test_asha_time_to_target_gain() -> None:
    # Measured 1.10x (95 % CI 1.06-1.14): the paper's lower bound (10-30 %); asserted with a margin.
    s = speedup("asha", "time_to_target")
    assert s.ratio >= 1.05 and s.low > 1.0, str(s)


@pytest.mark.xfail(
    strict=True,
    reason="paper: BOHB reaches the target 10-30 % sooner under Fluid (dissertation Fig. 3.7, §3.6.1: CIFAR-10, WLM "
    "and DCGAN tuning on 8 Quadro RTX 6000 GPUs, 5 runs). Here: the synthetic tuning simulator (seeded learning "
    "curves, 40 samples, budgets 1/3/9/27, target score 0.85, packing slowdown 1.15, 8 GPUs, 200 paired seeds); "
    "the paper's sample count, budgets and curves are not given. Measured 0.95x (CI 0.92-0.98): with twice the "
    "concurrency fewer configs are drawn from BOHB's model, which is fit on low rungs that rank configs partly "
    "by learning speed (1.02x without packing); docs/results-fluid.md",
)
def test_bohb_time_to_target_gain_at_least_10_percent() -> None:
    s = speedup("bohb", "time_to_target")
    assert s.ratio >= 1.1, str(s)


def test_asha_time_to_target_gain_comes_from_spreading_not_packing() -> None:
    # docs/results-fluid.md "The asynchronous gap": the winner is usually among the first samples, so
    # packing it with a neighbour slows it by alpha; the gain is DynamicFluid spreading the survivors
    # over freed GPUs once no trial waits.
    no_dynamic = speedup("asha", "time_to_target", dynamic=False)
    no_packing = speedup("asha", "time_to_target", pack=1)
    assert no_dynamic.ratio < 1.0 < no_packing.ratio, f"no DynamicFluid {no_dynamic}; c = 1 {no_packing}"


def test_pbt_changes_least() -> None:
    pbt = speedup("pbt", "makespan").ratio
    assert pbt < speedup("hyperband", "makespan").ratio and pbt < speedup("asha", "makespan").ratio
    assert pbt < 1.3


def list_schedule(heights: list[float], gpus: int) -> float:
    """Makespan of greedy list scheduling, one trial per GPU, in the given order."""
    free = [0.0] * gpus
    for h in heights:
        i = free.index(min(free))
        free[i] += h
    return max(free)


def test_ten_x_packing_overhead_disables_packing() -> None:
    # Fig. 3.13a keeps every mechanism on; only the overhead changes. At 10x Eq. 3.1 gives c = 1 and no GPU
    # ever holds two trials; at 1.5x (c = 2) some do, so the check can fail.
    base_run, fluid_run, c = packing_overhead_runs(10.0)
    assert c == 1 and fluid_run.peak_trials_per_gpu == 1 == base_run.peak_trials_per_gpu
    assert packing_overhead_runs(1.5)[1].peak_trials_per_gpu == 2
    base, fluid = base_run.makespan, fluid_run.makespan
    h = grid_heights()
    # FIFO is list scheduling in submission order; with c = 1 and no spreading or re-planning Fluid is
    # exactly list scheduling in Alg. 3.1's order (h non-increasing): no packing happens at all.
    assert base == pytest.approx(list_schedule(h, 8))
    _, ordered, _ = packing_overhead_grid(10.0, fluid=FluidConfig(max_workers=1, dynamic=False))
    assert ordered == pytest.approx(list_schedule(sorted(h, reverse=True), 8))
    # The rest of full Fluid's gain is DynamicFluid spreading the last trials over idle GPUs (d = 4).
    _, no_spread, _ = packing_overhead_grid(10.0, fluid=FluidConfig(max_workers=1))
    assert no_spread == pytest.approx(ordered)
    # Hence Fluid at 10x is not the baseline: 1198 s FIFO, 1128 s LPT (1.06x), 1037 s with spreading.
    assert fluid < ordered <= base, f"FIFO {base:.0f} s, LPT {ordered:.0f} s, Fluid {fluid:.0f} s"
    assert base / fluid < 1.2
    base15, fluid15, c15 = packing_overhead_grid(1.5)
    assert c15 == 2 and base15 / fluid15 > base / fluid  # small overhead: packing still pays


def _ttt_vs_fifo8(gpus: int, executor: str) -> Speedup:
    """How much sooner than FIFO on 8 GPUs the target is reached (> 1: sooner)."""
    return paired_speedup(_runs("asha", "fifo", 8), _runs("asha", executor, gpus), "time_to_target")


def test_asha_scaling_with_and_without_fluid() -> None:
    fifo4, fifo16 = _ttt_vs_fifo8(4, "fifo"), _ttt_vs_fifo8(16, "fifo")
    fluid4, fluid16 = _ttt_vs_fifo8(4, "fluid"), _ttt_vs_fifo8(16, "fluid")
    got = f"vs FIFO 8: FIFO 4 {fifo4}; FIFO 16 {fifo16}; Fluid 4 {fluid4}; Fluid 16 {fluid16}"
    assert fifo4.ratio < 0.9, got  # 8 workers beat 4
    # More concurrency makes ASHA decide with fewer results: fewer runs ever reach the target.
    assert fifo4.other_reached > fifo16.other_reached, got
    assert fluid4.ratio >= 1 / 1.2, got  # with Fluid, 4 GPUs come within 20 % of FIFO on 8
    assert fluid16.low > 1.0, got  # and more GPUs do better


@pytest.mark.xfail(
    strict=True,
    reason="paper: without Fluid, ASHA on 8 workers reaches the target soonest of 4/8/16 (dissertation Fig. 3.10, "
    "§3.6.2, CIFAR-10 on Ray Tune, no reason given). Here the same 4/8/16 workers on the synthetic tuning "
    "simulator, which charges nothing per worker (no communication, scheduler or Ray overhead): 16 workers "
    "reach the target 1.06x sooner than 8, though fewer runs ever reach it (155 vs 157 of 200) and the best "
    "score at 600 s is lower; docs/results-fluid.md",
)
def test_asha_without_fluid_best_at_8_workers() -> None:
    assert _ttt_vs_fifo8(16, "fifo").ratio < 1.0
