"""ρ estimates against the paper's worked numbers (Themis Table 2, §4.3.3)."""

import math

import pytest
from tessera.policy.themis.estimate import (
    HalvingPlan,
    NAvg,
    halving_remaining,
    iter_time,
    rho,
    single_job_remaining,
    t_id,
)

PLAN = HalvingPlan(num_configs=4, iters_per_phase=(8, 16, 36), job_demand_max=8)
TIMES = [80.0, 100.0, 100.0, 120.0]


def test_table2_bid_arithmetic() -> None:
    # T_id = 400; one GPU → T_sh = 200 → ρ = 1/2; two GPUs → 100 → 1/4 (Themis Table 2, §3.1.2).
    tid = 400.0
    one = single_job_remaining(iters_left=10, iter_time_serial=20, slowdown=1.0, gpus=1, job_demand_max=2)
    two = single_job_remaining(iters_left=10, iter_time_serial=20, slowdown=1.0, gpus=2, job_demand_max=2)
    assert rho(0.0, one, tid) == pytest.approx(0.5)
    assert rho(0.0, two, tid) == pytest.approx(0.25)
    # Homogeneity at zero elapsed time: ρ(2G) = ρ(G) / 2.
    assert rho(0.0, two, tid) == pytest.approx(rho(0.0, one, tid) / 2)
    # Empty allocation: infinite T_sh, capped.
    assert rho(0.0, single_job_remaining(10, 20, 1.0, 0, 2), tid, rho_cap=1e6) == 1e6


def test_eq1_caps_speedup_at_job_demand_and_applies_slowdown() -> None:
    assert iter_time(10.0, 1.3, 8, 4) == pytest.approx(10.0 * 1.3 / 4)
    assert iter_time(10.0, 1.0, 0, 4) == math.inf


def test_tid_of_the_successive_halving_example() -> None:
    # T_id = 10000 × 4 / 16 = 2500 s (Themis §4.3.3).
    assert t_id(10_000, 16, 32, 4.0, "paper") == pytest.approx(2500)
    assert PLAN.demand_max >= 16
    with pytest.raises(ValueError, match="unknown T_id mode"):
        t_id(1, 1, 1, 1, "nope")  # type: ignore[arg-type]


@pytest.mark.parametrize(("gpus", "expected"), [(1, 4.0), (2, 2.0), (4, 1.0), (8, 0.5), (16, 0.34)])
def test_table3_successive_halving_bids(gpus: int, expected: float) -> None:
    rem = halving_remaining(PLAN, 0, [8, 8, 8, 8], TIMES, None, gpus)
    assert rem / 2500 == pytest.approx(expected, abs=0.001)


def test_two_gpu_bid_phase_breakdown_matches_paper() -> None:
    # T_sh(1) = 1600, T_sh(2) = 1600, T_sh(3) = 1800 → 5000, ρ = 2.
    assert halving_remaining(PLAN, 0, [8, 8, 8, 8], TIMES, None, 2) == pytest.approx(5000)
    assert halving_remaining(PLAN, 1, [16, 16], [100, 100], None, 2) == pytest.approx(3400)


def test_actual_rule_for_the_current_phase() -> None:
    # Spec §6.2: with each job's own time in phase 1, 4/8/16 GPUs give 1.064 / 0.532 / 0.356.
    for gpus, expected in ((4, 1.064), (8, 0.532), (16, 0.356)):
        rem = halving_remaining(PLAN, 0, [8, 8, 8, 8], TIMES, None, gpus, current_rule="actual")
        assert rem / 2500 == pytest.approx(expected, abs=0.001)


def test_revised_bid_uses_corrected_arithmetic() -> None:
    # Survivors 120 s and 100 s: T_sh(2) = 120 × 16 = 1920 (the paper prints 3200, an erratum),
    # T_sh(3) = 120 × 36 / 2 = 2160 → 5680, ρ = 2.272.
    rem = halving_remaining(PLAN, 0, [8, 8, 8, 8], TIMES, [120.0, 100.0], 2)
    assert rem == pytest.approx(1600 + 1920 + 2160)
    assert rem / 2500 == pytest.approx(2.272)


def test_exact_tid_differs_only_when_demand_is_below_the_share() -> None:
    assert t_id(1000, 16, 16, 4, "exact") == pytest.approx(t_id(1000, 16, 16, 4, "paper"))
    # demand 1 < 16/4: the paper's formula overestimates the 1/N-cluster time.
    assert t_id(1000, 16, 1, 4, "paper") == pytest.approx(4000)
    assert t_id(1000, 16, 1, 4, "exact") == pytest.approx(1000)


def test_navg_is_time_weighted() -> None:
    n = NAvg(0.0, 2)
    n.update(100.0, 4)
    assert n.value(200.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="backwards"):
        n.update(50.0, 1)
