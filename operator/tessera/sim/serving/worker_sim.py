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
    reqs = sorted(requests, key=lambda r: (r.arrival, r.rid))
    stats = RunStats(policy)
    done: set[int] = set()
    running: list[tuple[float, int, int, Batch, float]] = []  # (finish, seq, worker, batch, start)
    idle = set(range(workers))
    i, seq, t = 0, 0, 0.0

    def record(o: RequestOutcome) -> None:
        if o.request.rid in done:
            raise RuntimeError(f"request {o.request.rid} got two outcomes")
        done.add(o.request.rid)
        stats.outcomes.append(o)

    while True:
        t_arr = reqs[i].arrival if i < len(reqs) else math.inf
        t_fin = running[0][0] if running else math.inf
        wake = scheduler.next_wakeup(t)
        t_wake = wake if wake is not None and wake > t else math.inf
        t = min(t_arr, t_fin, t_wake)
        if t == math.inf:
            break
        while running and running[0][0] <= t:
            fin, _, w, batch, start = heapq.heappop(running)
            solo = {r.rid: r.solo_time for r in batch.requests if rng.random() < profile_rate}
            scheduler.on_complete(batch, BatchTimings(start, fin, solo), fin)
            for r in batch.requests:
                record(RequestOutcome(r, fin))
            idle.add(w)
        while i < len(reqs) and reqs[i].arrival <= t:
            scheduler.enqueue(reqs[i], t)
            i += 1
        advance = getattr(scheduler, "advance", None)
        if advance is not None:  # planners that act while the worker is busy (Clockwork's controller)
            advance(t)
        for w in sorted(idle):
            nb = scheduler.next_batch(t, w)
            for d in scheduler.take_drops():
                record(RequestOutcome(d.request, None, d.reason))
            if nb is None:
                break
            batch = nb
            start = max(t, batch.start)
            dur = latency.batch_time([r.solo_time for r in batch.requests])
            stats.batch_sizes.append(batch.size)
            stats.busy_time += dur
            idle.discard(w)
            seq += 1
            heapq.heappush(running, (start + dur, seq, w, batch, start))
        if on_progress is not None:
            on_progress(len(done))
    # Anything the scheduler still holds at the end was never served.
    for d in scheduler.take_drops():
        record(RequestOutcome(d.request, None, d.reason))
    for r in reqs:
        if r.rid not in done:
            record(RequestOutcome(r, None, DropReason.EXPIRED))
    stats.horizon = max((o.finish or o.request.arrival) for o in stats.outcomes) if stats.outcomes else 0.0
    return stats
