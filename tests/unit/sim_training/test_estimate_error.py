"""Estimation error for the Fig. 17 error analysis: per-app errors in [−X, X] on iterations and S."""

from __future__ import annotations

import math
import random

import pytest
from tessera.cluster import Cluster
from tessera.policy.training import AppState, Grant, RoundDecision
from tessera.sim.training.estimate_error import AppError, MisestimatingEstimator
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import AppSpec, JobSpec, Trace


class _OneJob:
    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return math.inf if gpus <= 0 else 1000.0 * slowdown / min(gpus, 2)


def test_errors_are_bounded_deterministic_and_vary_by_app_and_seed() -> None:
    draws = [AppError.draw(f"app-{i}", 0.2) for i in range(200)]
    assert all(-0.2 <= e.iterations <= 0.2 and -0.2 <= e.slowdown <= 0.2 for e in draws)
    assert AppError.draw("app-7", 0.2) == draws[7]
    assert AppError.draw("app-7", 0.2, seed=1) != draws[7]
    assert len({e.iterations for e in draws}) == 200
    assert min(e.iterations for e in draws) < -0.15 and max(e.iterations for e in draws) > 0.15  # uniform


def test_misestimating_estimator_scales_iterations_and_slowdown() -> None:
    est = MisestimatingEstimator(_OneJob(), AppError(iterations=0.1, slowdown=-0.2))
    # true: 1000 × 1.3 / 2 = 650 s; believed: 1000 × 1.1 (iterations) × 1.3 × 0.8 (S) / 2 = 572 s
    assert est.remaining_time(2, 1.3) == pytest.approx(572.0)
    assert math.isinf(est.remaining_time(0, 1.0))


def test_estimate_error_is_validated() -> None:
    with pytest.raises(ValueError, match="estimate_error"):
        SimConfig(estimate_error=1.0)


class _Greedy:
    """Gives every free GPU to the first hungry app and records what it was told."""

    name = "greedy"
    lease_s = math.inf

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def allocate(
        self, now: float, apps: list[AppState], cluster: Cluster, free: list[str], rng: random.Random
    ) -> RoundDecision:
        d = RoundDecision()
        for a in apps:
            self.seen.setdefault(a.app_id, a.total_work)
            if a.unmet and free:
                d.grants.append(Grant(a.app_id, tuple(free[: a.unmet]), math.inf, "auction"))
                free = free[a.unmet :]
        return d


def test_only_the_policy_view_is_wrong_the_jobs_run_at_true_speed() -> None:
    cluster = Cluster.build([(1, 2)])
    trace = Trace([AppSpec("a", 0.0, (JobSpec(100.0, 1.0, 2),))])  # 100 iterations × 1 s on 2 GPUs
    exact, wrong = _Greedy(), _Greedy()
    r0 = simulate(exact, cluster, trace, random.Random(0), SimConfig())
    r1 = simulate(wrong, cluster, trace, random.Random(0), SimConfig(estimate_error=0.5))
    err = AppError.draw("a", 0.5)
    assert wrong.seen["a"] == pytest.approx(exact.seen["a"] * (1 + err.iterations))
    assert r1.makespan == pytest.approx(r0.makespan)  # the job itself is unchanged
