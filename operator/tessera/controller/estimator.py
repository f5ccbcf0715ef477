"""How an App answers the ARBITER's "how long with k GPUs?" (the Estimator of tessera.policy.training).

Built from the App's spec (iterTotal, iterTimeSerialSeconds, maxGPUs per job) and the progress the
workloads reported. One job is Eq. 1 (spec seed-themis §1.4, paper L880-L946), evaluated with
`tessera.policy.themis.estimate.single_job_remaining`. Several independent jobs use the bound "T_sh is set
by the job that finishes last" (L1039-L1057) in its list-scheduling form
max(Σw / min(k, Σd), max_j w_j / min(k, d_j)) — the same rule the training simulator's JobSetRuntime uses
(that copy lives in tessera.sim, which the controller must not import).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.policy.themis.estimate import single_job_remaining


@dataclass(frozen=True, slots=True)
class JobWork:
    """One job's remaining work: iterations left, serial seconds per iteration, most GPUs it can use."""

    name: str
    iters_left: float
    iter_time_serial: float
    max_gpus: int

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
        total = sum(j.work for j in live)
        dsum = sum(j.max_gpus for j in live)
        longest = max(j.work / min(gpus, j.max_gpus) for j in live)
        return slowdown * max(total / min(gpus, dsum), longest)


def estimator_for(jobs: Sequence[JobWork]) -> JobSetEstimator:
    return JobSetEstimator(tuple(jobs))
