"""Finish-time fairness ρ = T_sh / T_id and its ingredients (Themis (Mahajan et al., NSDI'20) §3.2, §4.3).

Eq. 1 (single job, §4.3.1), Eq. 2 (successive halving, §4.3.2, median job for future phases as in
the §4.3.3 example), and N_avg as a time-weighted average of active apps (§4.3.1; Tessera's choice).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TidMode = Literal["paper", "exact"]


def iter_time(iter_time_serial: float, slowdown: float, gpus: int, job_demand_max: int) -> float:
    """Eq. 1: iter_time(G) = iter_time_serial × S(G) / min(‖G‖₁, job_demand_max)."""
    if gpus <= 0:
        return math.inf
    return iter_time_serial * slowdown / min(gpus, job_demand_max)


def t_id(
    total_work: float, cluster_gpus: int, demand_max: int, n_avg: float, mode: TidMode = "paper"
) -> float:
    """Independent finish time on a 1/N_avg share of the cluster.

    "paper": T_cluster × N_avg with T_cluster = work / min(R_C, demand_max) (Themis §4.3.1).
    "exact": work / min(R_C / N_avg, demand_max): the true 1/N-cluster time (Tessera's reading of Eq. 1; the paper's form overstates T_id when demand_max < R_C).
    """
    if total_work < 0 or cluster_gpus <= 0 or demand_max <= 0 or n_avg <= 0:
        raise ValueError(
            f"t_id needs work >= 0 and positive cluster size, demand and N_avg; got "
            f"work={total_work}, R_C={cluster_gpus}, demand={demand_max}, N_avg={n_avg}"
        )
    if mode == "paper":
        return total_work / min(cluster_gpus, demand_max) * n_avg
    if mode == "exact":
        return total_work / min(cluster_gpus / n_avg, demand_max)
    raise ValueError(f"unknown T_id mode {mode!r}; use 'paper' or 'exact'")


def rho(elapsed: float, remaining_time: float, tid: float, rho_cap: float = 1e6) -> float:
    """ρ = (T_current − T_start + remaining) / T_id, capped at rho_cap (Themis §3.3.1: ρ_old = ∞ → cap)."""
    if tid <= 0:
        raise ValueError(f"T_id must be positive, got {tid}")
    if not math.isfinite(remaining_time):
        return rho_cap
    return min(rho_cap, (elapsed + remaining_time) / tid)


def single_job_remaining(
    iters_left: float, iter_time_serial: float, slowdown: float, gpus: int, job_demand_max: int
) -> float:
    """Eq. 1's iter_left × iter_time(G)."""
    if iters_left <= 0:
        return 0.0
    return iters_left * iter_time(iter_time_serial, slowdown, gpus, job_demand_max)


def phase_time(
    iter_times: Sequence[float], iters: float, gpus: int, job_demand_max: int, slowdown: float = 1.0
) -> float:
    """One successive-halving phase on `gpus` GPUs: the slowest job's time (Eq. 2: max_j T(G_j)).

    GPUs are split evenly across the phase's jobs, each capped at job_demand_max; with fewer GPUs than
    jobs the jobs run in waves of `gpus` one-GPU jobs (Themis §4.3.3: the reading that reproduces Table 3).
    """
    jobs = sorted(iter_times, reverse=True)
    if not jobs or iters <= 0:
        return 0.0
    if gpus <= 0:
        return math.inf
    if gpus < len(jobs):
        # Waves: longest jobs first onto the emptiest GPU (LPT); exact for equal jobs.
        loads = [0.0] * gpus
        for t in jobs:
            i = loads.index(min(loads))
            loads[i] += t * iters * slowdown
        return max(loads)
    per_job = min(gpus // len(jobs), job_demand_max)
    return max(jobs) * iters * slowdown / per_job


def equal_phase_time(
    iter_time_: float, n_jobs: int, iters: float, gpus: int, job_demand_max: int, slowdown: float = 1.0
) -> float:
    """`phase_time` for n_jobs jobs of equal iteration time, without building the job list.

    Bit-identical to `phase_time([iter_time_] * n_jobs, …)`: with equal jobs LPT fills the GPUs round
    robin, so the fullest GPU holds ⌈n/g⌉ jobs, summed in the same order.
    """
    if n_jobs <= 0 or iters <= 0:
        return 0.0
    if gpus <= 0:
        return math.inf
    w = iter_time_ * iters * slowdown
    if gpus < n_jobs:
        load = 0.0
        for _ in range(-(-n_jobs // gpus)):
            load += w
        return load
    return w / min(gpus // n_jobs, job_demand_max)


def _phase_actual(
    iters_left: Sequence[float], iter_times: Sequence[float], gpus: int, job_demand_max: int, slowdown: float
) -> float:
    loads = sorted((n * t * slowdown for n, t in zip(iters_left, iter_times, strict=True)), reverse=True)
    if gpus < len(loads):
        bins = [0.0] * gpus
        for w in loads:
            i = bins.index(min(bins))
            bins[i] += w
        return max(bins)
    return loads[0] / min(gpus // len(loads), job_demand_max)


@dataclass(frozen=True, slots=True)
class HalvingPlan:
    """A successive-halving app's shape: jobs per phase follow n / eta^(i−1) (Themis §4.3.2).

    `demand_growth` is how a survivor's GPU demand grows per phase. The paper's text (Themis §4.3.2) doubles it
    as the jobs halve ("the best n/2 jobs, with maximum demand 2 GPUs … until 1 job with maximum demand n
    GPUs"), keeping the app's width constant; its worked example (§4.3.3) keeps every
    job at job_demand_max = 8. Default 1 (the worked example); the trace generator uses eta (the text).
    """

    num_configs: int
    iters_per_phase: tuple[float, ...]
    job_demand_max: int
    eta: int = 2
    demand_growth: int = 1

    def __post_init__(self) -> None:
        if self.demand_growth < 1:
            raise ValueError(f"demand_growth must be >= 1, got {self.demand_growth}")

    def jobs_in_phase(self, phase: int) -> int:
        return max(1, self.num_configs // int(self.eta**phase))

    def job_demand(self, phase: int) -> int:
        """GPUs one job of `phase` can use."""
        return self.job_demand_max * int(self.demand_growth**phase)

    @property
    def num_phases(self) -> int:
        return len(self.iters_per_phase)

    @property
    def demand_max(self) -> int:
        return max(self.jobs_in_phase(p) * self.job_demand(p) for p in range(self.num_phases))


def halving_remaining(
    plan: HalvingPlan,
    phase: int,
    current_iters_left: Sequence[float],
    current_iter_times: Sequence[float],
    survivor_iter_times: Sequence[float] | None,
    gpus: int,
    slowdown: float = 1.0,
    current_rule: Literal["median", "actual"] = "median",
) -> float:
    """Themis Eq. 2 (§4.3.2) with Tessera's elapsed-time split: the rest of the current phase plus
    every future phase.

    current_rule "median" uses the median job for the current phase too (this reproduces Table 3 exactly);
    "actual" uses each job's own iteration time. Future phases use the median of the current jobs until
    the survivors are known; known survivors are costed pessimistically by the slowest of them, as the
    revised bid at the end of §4.3.3 does (T_sh(3) = 120 × 36 / 2).
    """
    if gpus <= 0:
        return math.inf
    med = statistics.median(current_iter_times) if current_iter_times else 0.0
    total = 0.0
    live = [(left, t) for left, t in zip(current_iters_left, current_iter_times, strict=True) if left > 0]
    if live:
        if current_rule == "median":
            iters = max(left for left, _ in live)
            total += equal_phase_time(med, len(live), iters, gpus, plan.job_demand(phase), slowdown)
        else:
            total += _phase_actual(
                [left for left, _ in live], [t for _, t in live], gpus, plan.job_demand(phase), slowdown
            )
    for p in range(phase + 1, plan.num_phases):
        n = plan.jobs_in_phase(p)
        if survivor_iter_times and p == phase + 1:
            times = sorted(survivor_iter_times, reverse=True)[:n]
        elif survivor_iter_times:
            times = [max(survivor_iter_times)] * n
        else:
            total += equal_phase_time(med, n, plan.iters_per_phase[p], gpus, plan.job_demand(p), slowdown)
            continue
        total += phase_time(times, plan.iters_per_phase[p], gpus, plan.job_demand(p), slowdown)
    return total


class NAvg:
    """Time-weighted average number of active apps over [T_start, now] (Themis §4.3.1)."""

    __slots__ = ("_area", "_last", "_n", "start")

    def __init__(self, start: float, n_active: int) -> None:
        self.start = start
        self._last = start
        self._n = max(1, n_active)
        self._area = 0.0

    def update(self, now: float, n_active: int) -> None:
        """Record that from `now` on there are n_active apps (counting this one)."""
        if now < self._last:
            raise ValueError(f"time went backwards: {now} < {self._last}")
        self._area += self._n * (now - self._last)
        self._last = now
        self._n = max(1, n_active)

    def value(self, now: float) -> float:
        span = now - self.start
        if span <= 0:
            return float(self._n)
        return (self._area + self._n * (now - self._last)) / span
