"""How a simulated app uses the GPUs it leases: the `AppRuntime` protocol and two built-in runtimes.

The cluster-wide policy (Themis or a baseline) decides *which GPUs an app holds*; the app's runtime
decides *what runs on them* (Themis' two-level split, §4.2.2). Anything that implements
`AppRuntime` can be plugged into the simulator — e.g. a hyperparameter tuner placing its trials inside
the app's lease.

AppRuntime protocol (all times absolute simulated seconds, work in serial GPU-seconds):

* `set_gpus(now, gpus)`  — the app's GPU set changed (grant, lease expiry, release). Called once per
  change with the complete new set. The runtime re-divides the GPUs among its jobs; a job whose GPU set
  changes pays the checkpoint/restart cost.
* `advance(now)`         — bring progress up to `now` and handle internal events (job or phase done).
  The simulator calls it at `next_event()` and before reading state.
* `next_event()`         — the next time the runtime's state changes by itself (math.inf if never).
* `demand()`             — GPUs it can use right now; `peak_demand()` over its life (T_cluster).
* `total_work()` / `remaining_work(now)` — serial GPU-seconds overall / still to do.
* `remaining_time(gpus, slowdown)` — the bid answer: seconds to finish on `gpus` GPUs (Eq. 1 / Eq. 2).
* `used_gpus()`          — GPUs its jobs run on; the rest of its set can be returned.
* `done()`, and `placement_scores` — 1/S of every job placement it made (the placement-score CDF).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tessera.cluster import Cluster, Sensitivity
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.themis.apps import JobLoad, last_job_finish_time
from tessera.policy.themis.estimate import HalvingPlan, halving_remaining


class AppRuntime(Protocol):
    placement_scores: list[float]

    def set_gpus(self, now: float, gpus: frozenset[str]) -> None: ...
    def advance(self, now: float) -> None: ...
    def next_event(self) -> float: ...
    def demand(self) -> int: ...
    def peak_demand(self) -> int: ...
    def total_work(self) -> float: ...
    def remaining_work(self, now: float) -> float: ...
    def remaining_time(self, gpus: int, slowdown: float) -> float: ...
    def used_gpus(self) -> frozenset[str]: ...
    def done(self) -> bool: ...


@dataclass(slots=True)
class Job:
    name: str
    iterations: float
    iter_time: float  # serial seconds per iteration on one GPU
    demand: int  # job_demand_max: GPUs its gang can use
    sensitivity: Sensitivity
    done_iters: float = 0.0
    gpus: tuple[str, ...] = ()
    paused_until: float = 0.0
    rate: float = 0.0  # iterations per second while running
    score: float = 0.0  # successive halving: higher survives

    @property
    def left(self) -> float:
        d = self.iterations - self.done_iters
        return d if d > 0.0 else 0.0  # max(0.0, d) without the call: this is the hottest property


_EPS = 1e-6


class JobSetRuntime:
    """Jobs sharing the app's GPUs: gangs of up to `demand` GPUs, linear speedup, slowdown S of the gang's
    locality (Eq. 1). Unfinished jobs run in order; GPUs are split evenly and packed per machine."""

    def __init__(self, cluster: Cluster, jobs: Sequence[Job], restart_s: float) -> None:
        if not jobs:
            raise ValueError("an app needs at least one job")
        self.cluster = cluster
        self.restart_s = restart_s
        self.jobs: list[Job] = list(jobs)
        self.gpus: frozenset[str] = frozenset()
        self.last = 0.0
        self.placement_scores: list[float] = []
        self._version = 0
        self._agg: tuple[int, list[JobLoad], dict[tuple[int, float], float]] | None = None
        self._live_jobs: list[Job] = list(self.jobs)
        self._running: list[Job] = []
        self._waiting_work = sum(j.left * j.iter_time for j in self.jobs)
        self._demand = min(len(cluster), sum(j.demand for j in self.jobs))
        self._peak = self._demand
        self._total = sum(j.iterations * j.iter_time for j in self.jobs)

    # --- GPU assignment ---------------------------------------------------------------------------

    def set_gpus(self, now: float, gpus: frozenset[str]) -> None:
        self.advance(now)
        self.gpus = frozenset(gpus)
        self._assign(now)

    def _live(self) -> list[Job]:
        return self._live_jobs

    def _targets(self, live: list[Job], n: int) -> list[int]:
        need = [j.demand for j in live]
        if n >= sum(need):
            return need
        # Running jobs first (fewer restarts), then in order; even split capped at each job's demand.
        order = sorted(range(len(live)), key=lambda i: (not live[i].gpus, i))
        out = [0] * len(live)
        left = n
        while left > 0:
            progressed = False
            for i in order:
                if left and out[i] < need[i]:
                    out[i] += 1
                    left -= 1
                    progressed = True
            if not progressed:
                break
        return out

    def _assign(self, now: float) -> None:
        self._version += 1
        live = self._live_jobs = [j for j in self.jobs if j.left > _EPS]
        self._demand = min(len(self.cluster), sum(j.demand for j in live))
        for j in self.jobs:
            if j.left <= _EPS and j.gpus:
                j.gpus, j.rate = (), 0.0
        targets = self._targets(live, len(self.gpus))
        taken: set[str] = set()
        keep: list[tuple[str, ...]] = []
        for j, t in zip(live, targets, strict=True):
            mine = tuple(g for g in j.gpus if g in self.gpus)[:t]
            keep.append(mine)
            taken.update(mine)
        pool = FreePool(self.cluster, self.cluster.sorted(g for g in self.gpus if g not in taken))
        for j, t, mine in zip(live, targets, keep, strict=True):
            extra = pool.take(Anchor.of(self.cluster, mine), t - len(mine)) if t > len(mine) else []
            new = tuple(mine) + tuple(extra)
            if set(new) != set(j.gpus):
                j.gpus = new
                if new:
                    s = self.cluster.slowdown(new, j.sensitivity)
                    j.rate = min(len(new), j.demand) / (j.iter_time * s)
                    j.paused_until = now + self.restart_s
                    self.placement_scores.append(1.0 / s)
                else:
                    j.rate = 0.0
        self._running = [j for j in live if j.gpus]
        self._waiting_work = sum(j.left * j.iter_time for j in live if not j.gpus)

    # --- time ------------------------------------------------------------------------------------

    def _progress(self, j: Job, now: float) -> float:
        start = max(self.last, j.paused_until)
        return (now - start) * j.rate if j.rate > 0 and now > start else 0.0

    def advance(self, now: float) -> None:
        if now < self.last - 1e-9:
            raise ValueError(f"runtime asked to go back in time: {now} < {self.last}")
        finished = False
        for j in self._running:
            if j.left > _EPS:
                j.done_iters = min(j.iterations, j.done_iters + self._progress(j, now))
                if j.left <= _EPS * max(1.0, j.iterations):
                    j.done_iters = j.iterations
                    finished = True
        if now > self.last:
            self._version += 1
        self.last = max(self.last, now)
        if finished:
            self._on_jobs_finished(now)

    def _on_jobs_finished(self, now: float) -> None:
        self._assign(now)

    def next_event(self) -> float:
        t = math.inf
        for j in self._running:
            if j.rate > 0 and j.left > _EPS:
                t = min(t, max(self.last, j.paused_until) + j.left / j.rate)
        return t

    # --- what the policy sees ----------------------------------------------------------------------

    def demand(self) -> int:
        return self._demand

    def peak_demand(self) -> int:
        return self._peak

    def total_work(self) -> float:
        return self._total

    def remaining_work(self, now: float) -> float:
        return self._waiting_work + sum(
            max(0.0, j.left - self._progress(j, now)) * j.iter_time for j in self._running
        )

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        """Eq. 1 for one job; for several, the performance-curve rule "T_sh is set by the job that finishes
        last" (Themis §4.3.2) — the one implementation in `tessera.policy.themis.apps`. The job loads are
        rebuilt only when the jobs' state changes (the arbiter asks many times per round)."""
        if gpus <= 0:
            return math.inf
        if self._agg is None or self._agg[0] != self._version:
            loads = [JobLoad(j.left * j.iter_time, j.demand) for j in self._live_jobs if j.left > _EPS]
            self._agg = (self._version, loads, {})
        _, loads, memo = self._agg
        hit = memo.get((gpus, slowdown))
        if hit is None:
            hit = memo[(gpus, slowdown)] = last_job_finish_time(loads, gpus, slowdown)
        return hit

    def used_gpus(self) -> frozenset[str]:
        return frozenset(g for j in self._running if j.left > _EPS for g in j.gpus)

    def done(self) -> bool:
        return not self._live_jobs


class GangJobsRuntime(JobSetRuntime):
    """A single-job app or a hyperparameter exploration whose jobs run to their (pre-computed) stop
    iteration (Hyperdrive-style performance-curve stopping, loss curves known ahead as in the paper's
    simulator, Themis §6.1)."""


@dataclass(slots=True)
class _HalvingState:
    phase: int = 0
    survivors: list[Job] = field(default_factory=list)


class SuccessiveHalvingRuntime(JobSetRuntime):
    """Successive halving (Themis §4.3.2): n configs run I_1 iterations on ≤ job_demand_max GPUs each, the
    best n/η continue for I_2 iterations, … until one is left. Phases end at a barrier (the slowest job)."""

    def __init__(
        self,
        cluster: Cluster,
        configs: Sequence[Job],
        plan: HalvingPlan,
        restart_s: float,
        current_rule: Literal["median", "actual"] = "median",
    ) -> None:
        if len(configs) != plan.num_configs:
            raise ValueError(f"successive halving needs {plan.num_configs} configs, got {len(configs)}")
        self.plan = plan
        self.all_configs = list(configs)
        self.current_rule: Literal["median", "actual"] = current_rule
        self.state = _HalvingState()
        for c in self.all_configs:
            c.iterations, c.demand = plan.iters_per_phase[0], plan.job_demand_max
        super().__init__(cluster, self.all_configs, restart_s)
        self._memo_key: tuple[int, float] = (-1, -1.0)
        self._memo: dict[tuple[int, float], float] = {}
        self._lefts: list[float] = []
        self._times: list[float] = []
        self._peak = min(len(cluster), plan.demand_max)
        med = statistics.median(c.iter_time for c in configs)
        self._budget = sum(
            plan.jobs_in_phase(p) * plan.iters_per_phase[p] * med for p in range(plan.num_phases)
        )
        self._future_work = [
            sum(plan.jobs_in_phase(q) * plan.iters_per_phase[q] * med for q in range(p + 1, plan.num_phases))
            for p in range(plan.num_phases)
        ]

    def _on_jobs_finished(self, now: float) -> None:
        if all(j.left <= _EPS for j in self.jobs) and self.state.phase + 1 < self.plan.num_phases:
            self.state.phase += 1
            p = self.state.phase
            keep = sorted(self.jobs, key=lambda j: -j.score)[: self.plan.jobs_in_phase(p)]
            for j in keep:
                j.iterations += self.plan.iters_per_phase[p]
                j.demand = min(len(self.cluster), self.plan.job_demand(p))
            self.jobs = keep
        self._assign(now)

    def peak_demand(self) -> int:
        return self._peak

    def total_work(self) -> float:
        return self._budget

    def remaining_work(self, now: float) -> float:
        """This phase's jobs at their own speed plus the future phases with the median job."""
        here = sum(max(0.0, j.left - self._progress(j, now)) * j.iter_time for j in self._live_jobs)
        return here + self._future_work[self.state.phase]

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return self._estimate(gpus, slowdown, self.last)

    def _estimate(self, gpus: int, slowdown: float, now: float) -> float:
        # The jobs' progress is fixed for one (state version, now): compute it once, then memoise per query.
        if (self._version, now) != self._memo_key:
            self._memo_key = (self._version, now)
            self._memo.clear()
            self._lefts = [max(0.0, j.left - self._progress(j, now)) for j in self.jobs]
            self._times = [j.iter_time for j in self.jobs]
        hit = self._memo.get((gpus, slowdown))
        if hit is None:
            hit = self._memo[(gpus, slowdown)] = halving_remaining(
                self.plan,
                self.state.phase,
                self._lefts,
                self._times,
                None,
                gpus,
                slowdown,
                self.current_rule,
            )
        return hit
