"""The job-set runtime's bid answer is the policy's multi-job finish-time rule, and successive-halving
survivors grow their GPU demand as the paper's text describes (Themis §4.3.2)."""

import math
import random

import pytest
from tessera.cluster import Cluster, Sensitivity
from tessera.policy.themis.apps import JobLoad, last_job_finish_time
from tessera.policy.themis.estimate import HalvingPlan, halving_remaining
from tessera.sim.training.runtime import GangJobsRuntime, Job, SuccessiveHalvingRuntime

C = Cluster.build([(1, 4)] * 8)


def _list_scheduling_bound(loads: list[tuple[float, int]], k: int, s: float) -> float:
    """The runtime's former private copy of the rule, kept here as the reference it must still match."""
    total = sum(w for w, _ in loads)
    dsum = sum(d for _, d in loads)
    longest = max([max(w / d for w, d in loads)] + [w / k for w, d in loads if d > k])
    return s * max(total / min(k, dsum), longest)


def test_hand_worked_three_jobs() -> None:
    # Works 400, 200, 200 GPU-s, demands 4, 1, 1 on 2 GPUs: the 400 job alone needs 400/2 = 200 s,
    # and all the work over 2 GPUs also needs 400 s → 400 s; × S 1.1 → 440.
    rt = GangJobsRuntime(
        C,
        [
            Job("a", 400, 1.0, 4, Sensitivity()),
            Job("b", 200, 1.0, 1, Sensitivity()),
            Job("c", 200, 1.0, 1, Sensitivity()),
        ],
        restart_s=0,
    )
    assert rt.remaining_time(2, 1.1) == pytest.approx(440.0)
    assert rt.remaining_time(0, 1.0) == math.inf


def test_runtime_answers_with_last_job_finish_time_and_matches_the_old_copy() -> None:
    rng = random.Random(7)
    for _ in range(50):
        jobs = [
            Job(f"j{i}", rng.uniform(10, 500), rng.uniform(0.2, 2.0), rng.choice((1, 2, 4, 8)), Sensitivity())
            for i in range(rng.randint(1, 6))
        ]
        rt = GangJobsRuntime(C, jobs, restart_s=0)
        rt.set_gpus(0.0, frozenset(C.gpu_ids[: rng.randint(0, 12)]))
        rt.advance(rng.uniform(0, 300))
        live = [(j.left * j.iter_time, j.demand) for j in rt.jobs if j.left > 1e-6]
        for k in (1, 2, 3, 8, 32):
            s = rng.choice((1.0, 1.1, 1.3))
            got = rt.remaining_time(k, s)
            assert got == last_job_finish_time([JobLoad(w, d) for w, d in live], k, s)
            assert got == (_list_scheduling_bound(live, k, s) if live else 0.0)


def test_halving_demand_growth_keeps_the_app_width_constant() -> None:
    plan = HalvingPlan(8, (10.0, 20.0, 40.0, 80.0), job_demand_max=1, eta=2, demand_growth=2)
    assert [plan.jobs_in_phase(p) * plan.job_demand(p) for p in range(4)] == [8, 8, 8, 8]
    assert plan.demand_max == 8
    # Equal budget per phase at constant width: each phase takes 10 × 1 s on 8 GPUs → 4 × 10 s.
    assert halving_remaining(plan, 0, [10.0] * 8, [1.0] * 8, None, 8) == pytest.approx(40.0)
    # With the worked example's constant demand, the last phase runs one 1-GPU job for 80 s.
    flat = HalvingPlan(8, (10.0, 20.0, 40.0, 80.0), job_demand_max=1, eta=2)
    assert halving_remaining(flat, 0, [10.0] * 8, [1.0] * 8, None, 8) == pytest.approx(10 + 20 + 40 + 80)
    with pytest.raises(ValueError, match="demand_growth"):
        HalvingPlan(8, (10.0,), 1, 2, 0)


def test_survivors_take_the_grown_demand_in_the_simulated_runtime() -> None:
    plan = HalvingPlan(4, (10.0, 20.0, 40.0), job_demand_max=1, eta=2, demand_growth=2)
    jobs = [Job(f"c{i}", 10, 1.0, 1, Sensitivity(), score=float(i)) for i in range(4)]
    rt = SuccessiveHalvingRuntime(C, jobs, plan, restart_s=0)
    rt.set_gpus(0.0, frozenset(C.gpu_ids[:4]))
    assert rt.demand() == 4
    rt.advance(rt.next_event())
    assert [j.demand for j in rt.jobs] == [2, 2] and rt.demand() == 4
    rt.advance(rt.next_event())
    assert [j.demand for j in rt.jobs] == [4] and rt.demand() == 4
