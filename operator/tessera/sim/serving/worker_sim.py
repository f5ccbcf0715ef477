"""Discrete-event simulation of one model served by batch-scheduled GPU workers.

The simulator owns the truth (each request's solo time, the batching model that turns a batch into an
execution time) and drives any :class:`~tessera.policy.serving.common.BatchScheduler` through its
interface: arrivals call ``enqueue``; an idle worker calls ``next_batch``; a finished batch calls
``on_complete`` with the measured time and, for a sampled fraction of members, their solo times (the
profiler's solo re-execution, Orloj §3.2). Every request ends in exactly one outcome: finished on
time, finished late, or dropped; a finish after the deadline is never counted as finished.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tessera.policy.serving.common import (
    Batch,
    BatchLatencyModel,
    BatchScheduler,
    BatchTimings,
    DropReason,
    Request,
)


@dataclass
class RequestOutcome:
    request: Request
    finish: float | None  # None when dropped
    drop_reason: DropReason | None = None

    @property
    def on_time(self) -> bool:
        return self.finish is not None and self.finish <= self.request.deadline + 1e-12


@dataclass
class RunStats:
    policy: str
    outcomes: list[RequestOutcome] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    busy_time: float = 0.0
    horizon: float = 0.0

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def finish_rate(self) -> float:
        return sum(o.on_time for o in self.outcomes) / max(1, self.n)

    @property
    def goodput(self) -> float:
        return sum(o.on_time for o in self.outcomes) / self.horizon if self.horizon > 0 else 0.0

    @property
    def drops(self) -> int:
        return sum(o.finish is None for o in self.outcomes)

    @property
    def late(self) -> int:
        return sum(o.finish is not None and not o.on_time for o in self.outcomes)

    def latency_percentile(self, q: float) -> float:
        lat = [o.finish - o.request.arrival for o in self.outcomes if o.finish is not None]
        return float(np.percentile(lat, q)) if lat else math.nan

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0


def simulate_workers(
    policy: str,
    scheduler: BatchScheduler,
    requests: Sequence[Request],
    latency: BatchLatencyModel,
    *,
    workers: int = 1,
    profile_rate: float = 0.05,
    rng: np.random.Generator,
    on_progress: Callable[[int], None] | None = None,
) -> RunStats:
    """Run ``requests`` (sorted by arrival) through ``scheduler`` on ``workers`` GPUs."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    sim = _WorkerSim(policy, scheduler, requests, latency, workers, profile_rate, rng)
    sim.run(on_progress)
    return sim.stats


class _WorkerSim:
    """One run's state; each step moves to the next arrival, batch end or scheduler wake-up, completes the
    batches due, enqueues the arrivals, and starts a batch on each idle worker the scheduler fills."""

    def __init__(
        self,
        policy: str,
        scheduler: BatchScheduler,
        requests: Sequence[Request],
        latency: BatchLatencyModel,
        workers: int,
        profile_rate: float,
        rng: np.random.Generator,
    ) -> None:
        self.scheduler, self.latency, self.profile_rate, self.rng = scheduler, latency, profile_rate, rng
        self.reqs = sorted(requests, key=lambda r: (r.arrival, r.rid))
        self.stats = RunStats(policy)
        self.done: set[int] = set()
        self.running: list[tuple[float, int, int, Batch, float]] = []  # (finish, seq, worker, batch, start)
        self.idle = set(range(workers))
        self.i, self.seq = 0, 0

    def run(self, on_progress: Callable[[int], None] | None) -> None:
        t = 0.0
        while True:
            t_arr = self.reqs[self.i].arrival if self.i < len(self.reqs) else math.inf
            t_fin = self.running[0][0] if self.running else math.inf
            wake = self.scheduler.next_wakeup(t)
            t_wake = wake if wake is not None and wake > t else math.inf
            t = min(t_arr, t_fin, t_wake)
            if t == math.inf:
                break
            self._complete(t)
            while self.i < len(self.reqs) and self.reqs[self.i].arrival <= t:
                self.scheduler.enqueue(self.reqs[self.i], t)
                self.i += 1
            advance = getattr(self.scheduler, "advance", None)
            if advance is not None:  # planners that act while the worker is busy (Clockwork's controller)
                advance(t)
            self._start(t)
            if on_progress is not None:
                on_progress(len(self.done))
        self._close()

    def _record(self, o: RequestOutcome) -> None:
        if o.request.rid in self.done:
            raise RuntimeError(f"request {o.request.rid} got two outcomes")
        self.done.add(o.request.rid)
        self.stats.outcomes.append(o)

    def _complete(self, t: float) -> None:
        """Batches that ended by `t` report their timings (a sample of solo times profiled) and free
        their workers."""
        while self.running and self.running[0][0] <= t:
            fin, _, w, batch, start = heapq.heappop(self.running)
            solo = {r.rid: r.solo_time for r in batch.requests if self.rng.random() < self.profile_rate}
            self.scheduler.on_complete(batch, BatchTimings(start, fin, solo), fin)
            for r in batch.requests:
                self._record(RequestOutcome(r, fin))
            self.idle.add(w)

    def _start(self, t: float) -> None:
        """Idle workers, in order, take the scheduler's next batch until it has none."""
        for w in sorted(self.idle):
            nb = self.scheduler.next_batch(t, w)
            for d in self.scheduler.take_drops():
                self._record(RequestOutcome(d.request, None, d.reason))
            if nb is None:
                break
            batch = nb
            start = max(t, batch.start)
            dur = self.latency.batch_time([r.solo_time for r in batch.requests])
            self.stats.batch_sizes.append(batch.size)
            self.stats.busy_time += dur
            self.idle.discard(w)
            self.seq += 1
            heapq.heappush(self.running, (start + dur, self.seq, w, batch, start))

    def _close(self) -> None:
        # Anything the scheduler still holds at the end was never served.
        for d in self.scheduler.take_drops():
            self._record(RequestOutcome(d.request, None, d.reason))
        for r in self.reqs:
            if r.rid not in self.done:
                self._record(RequestOutcome(r, None, DropReason.EXPIRED))
        outcomes = self.stats.outcomes
        self.stats.horizon = max((o.finish or o.request.arrival) for o in outcomes) if outcomes else 0.0
