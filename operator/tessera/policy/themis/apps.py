"""An App of several jobs answering "how long on k GPUs?" (Themis (Mahajan et al., NSDI'20) §4.3.1-4.3.2).

Pure rules shared by the operator's App estimator and the training simulator's job-set runtime, so the two
never disagree on a bid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobLoad:
    """One unfinished job: serial GPU-seconds still to do and the most GPUs it can use (d_j)."""

    work: float
    max_gpus: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.work) or self.work < 0:
            raise ValueError(f"a job's remaining work must be finite and >= 0, got {self.work}")
        if self.max_gpus < 1:
            raise ValueError(f"a job's maxGPUs must be >= 1, got {self.max_gpus}")


def last_job_finish_time(jobs: Sequence[JobLoad], gpus: int, slowdown: float = 1.0) -> float:
    """T_sh of independent jobs sharing k GPUs: "set by the job that finishes last" (Themis §4.3.2).

    Its list-scheduling form S · max(Σ_j w_j / min(k, Σ_j d_j), max_j w_j / min(k, d_j)): the jobs cannot
    finish before the total work is spread over every GPU they can use, nor before the biggest job runs on
    as many GPUs as it scales to. For one job this is Eq. 1 (w / min(k, d) · S). Jobs with no work left
    are ignored; no GPUs and work left is infinite.
    """
    live = [j for j in jobs if j.work > 0]
    if not live:
        return 0.0
    if gpus <= 0:
        return math.inf
    total = sum(j.work for j in live)
    dsum = sum(j.max_gpus for j in live)
    longest = max(j.work / min(gpus, j.max_gpus) for j in live)
    return slowdown * max(total / min(gpus, dsum), longest)
