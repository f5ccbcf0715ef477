"""What a policy is told vs what runs: estimation errors (Fig. 17) and misreported slowdowns (Fig. 18)."""

from __future__ import annotations

import math
import random

import pytest
from tessera.cluster import NETWORK_INTENSIVE, Cluster, Sensitivity
from tessera.policy.training import AppState, Grant, RoundDecision
from tessera.sim.training.estimate_error import AppError, MisestimatingEstimator
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import Trace, TraceApp, TraceJob


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
        self.sens: dict[str, Sensitivity] = {}

    def allocate(
        self, now: float, apps: list[AppState], cluster: Cluster, free: list[str], rng: random.Random
    ) -> RoundDecision:
        d = RoundDecision()
        for a in apps:
            self.seen.setdefault(a.app_id, a.total_work)
            self.sens.setdefault(a.app_id, a.sensitivity)
            if a.unmet and free:
                d.grants.append(Grant(a.app_id, tuple(free[: a.unmet]), math.inf, "auction"))
                free = free[a.unmet :]
        return d


def test_only_the_policy_view_is_wrong_the_jobs_run_at_true_speed() -> None:
    cluster = Cluster.build([(1, 2)])
    trace = Trace([TraceApp("a", 0.0, (TraceJob(100.0, 1.0, 2),))])  # 100 iterations × 1 s on 2 GPUs
    exact, wrong = _Greedy(), _Greedy()
    r0 = simulate(exact, cluster, trace, random.Random(0), SimConfig())
    r1 = simulate(wrong, cluster, trace, random.Random(0), SimConfig(estimate_error=0.5))
    err = AppError.draw("a", 0.5)
    assert wrong.seen["a"] == pytest.approx(exact.seen["a"] * (1 + err.iterations))
    assert r1.makespan == pytest.approx(r0.makespan)  # the job itself is unchanged


def test_a_misreported_slowdown_reaches_the_policy_but_not_the_jobs() -> None:
    cluster = Cluster.build([(1, 2)] * 2)  # a 4-GPU job must span two machines: S = 1.29 in truth
    trace = Trace([TraceApp("a", 0.0, (TraceJob(100.0, 4.0, 4),))])  # 100 × 4 s / 4 GPUs × 1.29 = 129 s
    lie = Sensitivity(1.0, 1.0, 3.0, 3.0)
    truthful, liar = _Greedy(), _Greedy()
    r0 = simulate(truthful, cluster, trace, random.Random(0), SimConfig(restart_s=0))
    r1 = simulate(
        liar, cluster, trace, random.Random(0), SimConfig(restart_s=0, reported_sensitivity=(("a", lie),))
    )
    assert truthful.sens["a"] == NETWORK_INTENSIVE and liar.sens["a"] == lie
    assert r0.makespan == pytest.approx(129.0) and r1.makespan == pytest.approx(129.0)
    with pytest.raises(ValueError, match="reported_sensitivity"):
        SimConfig(reported_sensitivity=(("a", {"cross_machine": 2.0}),))  # type: ignore[arg-type]
