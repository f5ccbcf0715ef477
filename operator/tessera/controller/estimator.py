"""How an App answers the ARBITER's "how long with k GPUs?" (the Estimator of tessera.policy.training).

Built from the App's spec (iterTotal, iterTimeSerialSeconds, maxGPUs per job) and the progress the
workloads reported. One job is Eq. 1 (Themis §4.3.1), evaluated with
`tessera.policy.themis.estimate.single_job_remaining`. Several independent jobs use the bound "T_sh is set
by the job that finishes last" (§4.3.2), `tessera.policy.themis.apps.last_job_finish_time`. A
successive-halving App (spec tuning.successiveHalving) answers with Eq. 2, `tessera.policy.themis.estimate.halving_remaining`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.policy.themis.apps import JobLoad, last_job_finish_time
from tessera.policy.themis.estimate import HalvingPlan, halving_remaining, single_job_remaining


@dataclass(frozen=True, slots=True)
class JobWork:
    """One job's remaining work: iterations left, serial seconds per iteration, most GPUs it can use."""

    name: str
    iters_left: float
    iter_time_serial: float
    max_gpus: int
    iters_done: float = 0.0

    @property
    def work(self) -> float:
        """Serial GPU-seconds still to do."""
        return max(0.0, self.iters_left) * self.iter_time_serial


@dataclass(frozen=True, slots=True)
class JobSetEstimator:
    """Remaining time of an App's unfinished jobs on k GPUs, each gang slowed by S."""

    jobs: tuple[JobWork, ...]

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        live = [j for j in self.jobs if j.iters_left > 0]
        if not live:
            return 0.0
        if gpus <= 0:
            return math.inf
        if len(live) == 1:
            j = live[0]
            return single_job_remaining(j.iters_left, j.iter_time_serial, slowdown, gpus, j.max_gpus)
        return last_job_finish_time([JobLoad(j.work, j.max_gpus) for j in live], gpus, slowdown)


@dataclass(frozen=True, slots=True)
class HalvingEstimator:
    """A successive-halving App (Themis §4.3.2): Eq. 2 over the rest of the current phase and
    every future phase. The phase is read from how many jobs are still live: phase p runs n / η^p jobs
    (the tuner marks the dropped configs done by letting their pods exit)."""

    plan: HalvingPlan
    jobs: tuple[JobWork, ...]

    @property
    def phase(self) -> int:
        live = sum(1 for j in self.jobs if j.iters_left > 0)
        phase = 0
        for p in range(self.plan.num_phases):
            if self.plan.jobs_in_phase(p) >= live:
                phase = p
        return phase

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        live = [j for j in self.jobs if j.iters_left > 0]
        if not live:
            return 0.0
        phase = self.phase
        through = sum(self.plan.iters_per_phase[: phase + 1])
        lefts = [min(j.iters_left, max(0.0, through - j.iters_done)) for j in live]
        times = [j.iter_time_serial for j in live]
        return halving_remaining(self.plan, phase, lefts, times, None, gpus, slowdown)


def estimator_for(
    jobs: Sequence[JobWork], halving: HalvingPlan | None = None
) -> JobSetEstimator | HalvingEstimator:
    if halving is not None:
        return HalvingEstimator(halving, tuple(jobs))
    return JobSetEstimator(tuple(jobs))
