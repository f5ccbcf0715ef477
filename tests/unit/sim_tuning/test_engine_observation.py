"""What the tuning simulator observes: time-to-target per iteration or per milestone, trials per GPU."""

from dataclasses import dataclass

import pytest
from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig, RuntimeModel
from tessera.policy.hpo import GridSearch, TrialRun
from tessera.sim.tuning.engine import Observe, TuningSim


@dataclass(frozen=True, slots=True)
class Ramp:
    """Iteration time `h` from the config; the score after iteration k is k / 10 (target 0.5)."""

    alpha: float = 1.0
    gpu_util: float = 1.0
    target: float = 0.5

    def iteration_time(self, spec: TrialRun) -> float:
        return spec.config["h"]

    def runtime_model(self, spec: TrialRun) -> RuntimeModel:
        return RuntimeModel(self.alpha, 1.0)

    def score(self, spec: TrialRun, iteration: int) -> float:
        return iteration / 10.0


def _run(hs: list[float], gpus: int, observe: Observe, c: int = 1, report_every: int = 8, alpha: float = 1.0):
    cluster = Cluster.homogeneous(1, gpus)
    alg = GridSearch([{"h": h} for h in hs], budget=10, report_every=report_every)
    fluid = FluidConfig(max_pack=c, max_workers=1)
    return TuningSim(cluster, cluster.gpu_ids, Ramp(alpha), alg, "fluid", fluid, observe=observe).run()


def test_target_seen_at_the_iteration_that_reaches_it() -> None:
    # One trial, 3 s per iteration, reports to the algorithm at iteration 8 only: the score reaches
    # 0.5 after iteration 5, i.e. at 15 s; a milestone-only observer first sees it at 8 · 3 = 24 s.
    assert _run([3.0], 1, "iteration").time_to_target == pytest.approx(15.0)
    assert _run([3.0], 1, "milestone").time_to_target == pytest.approx(24.0)


def test_packed_iteration_times_are_used_for_the_crossing() -> None:
    # Two trials share one GPU (c = 2, α = 1.2): each iteration takes 2 · 1.2 = 2.4 s, so iteration 5
    # completes at 12 s for both.
    r = _run([2.0, 2.0], 1, "iteration", c=2, alpha=1.2)
    assert r.peak_trials_per_gpu == 2
    assert r.time_to_target == pytest.approx(12.0)


def test_peak_trials_per_gpu_is_one_without_packing() -> None:
    assert _run([2.0, 3.0, 4.0], 2, "iteration", c=1).peak_trials_per_gpu == 1


def test_unknown_observe_mode_is_refused() -> None:
    cluster = Cluster.homogeneous(1, 1)
    with pytest.raises(ValueError, match="observe"):
        TuningSim(cluster, cluster.gpu_ids, Ramp(), GridSearch([{"h": 1.0}], 2), observe="never")  # type: ignore[arg-type]
