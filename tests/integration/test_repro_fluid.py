"""Fluid reproduction on seeded workloads (spec §4.2.8–9; seed Fig. 3.7, 3.10, 3.13a)."""

import pytest
from tessera.policy.fluid import FluidConfig
from tessera.sim.tuning.experiments import (
    grid_heights,
    mean_of,
    packing_overhead_grid,
    packing_overhead_runs,
    run_one,
)
from tessera.sim.tuning.workload import Workload

SEEDS = range(5)
FLUID = FluidConfig(max_pack=2, max_workers=4)


def speedup(name: str, metric: str, gpus: int = 8) -> float:
    base = [run_one(name, "fifo", gpus, s, Workload(), FLUID) for s in SEEDS]
    fluid = [run_one(name, "fluid", gpus, s, Workload(), FLUID) for s in SEEDS]
    return mean_of(base, metric) / mean_of(fluid, metric)


@pytest.mark.parametrize("name", ["hyperband", "syncbohb"])
def test_synchronous_stage_based_gain_at_least_30_percent(name: str) -> None:
    assert speedup(name, "makespan") >= 1.3


def test_hyperband_time_to_target_gain() -> None:
    assert speedup("hyperband", "time_to_target") >= 1.3


@pytest.mark.parametrize("name", ["asha", "bohb"])
def test_asynchronous_gain_at_least_10_percent_in_makespan(name: str) -> None:
    assert speedup(name, "makespan") >= 1.1


@pytest.mark.parametrize("name", ["asha", "bohb"])
def test_asynchronous_time_to_target_close_to_baseline(name: str) -> None:
    # NOT the paper's +10-30 % (docs/results-fluid.md, "The asynchronous gap"): time-to-target here is
    # one early-sampled winner's serial run, which packing slows by alpha. Measured: ASHA 1.04x, BOHB 0.95x.
    r = speedup(name, "time_to_target")
    assert 0.9 <= r < 1.1, f"{name} time-to-target speed-up {r:.3f}x left the measured band"


def test_pbt_changes_least() -> None:
    pbt = speedup("pbt", "makespan")
    assert pbt < speedup("hyperband", "makespan") and pbt < speedup("asha", "makespan")
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


def test_asha_scaling_with_and_without_fluid() -> None:
    ttt = {
        (n, ex): mean_of([run_one("asha", ex, n, s, Workload(), FLUID) for s in SEEDS], "time_to_target")
        for n in (4, 8, 16)
        for ex in ("fifo", "fluid")
    }
    got = ", ".join(f"{ex} {n}: {v:.0f} s" for (n, ex), v in sorted(ttt.items()))
    assert ttt[(8, "fifo")] < 0.8 * ttt[(4, "fifo")], got
    # The paper has 16 workers worse than 8 without Fluid; it gives no cause, and our model has no cost
    # for more workers, so 16 ties 8: the winner's serial run bounds time-to-target.
    assert ttt[(16, "fifo")] >= 0.95 * ttt[(8, "fifo")], got
    assert ttt[(4, "fluid")] <= 1.2 * ttt[(8, "fifo")], got  # with Fluid 4 GPUs come within 20 % of 8
    assert ttt[(16, "fluid")] < ttt[(8, "fifo")], got  # and more GPUs do better
