"""Symphony's multi-GPU baselines, as Symphony §5 compares against: Clockwork and Shepherd (Flex).

Both are centralised and **eager**: a free GPU takes work as soon as any is queued, which is what keeps
their batches small (Symphony §2.2). They share Symphony's per-model deadline queues, its GETBATCH (the
largest head-greedy batch that still meets the head's deadline) and its drop rule (a head that cannot
finish even alone is dropped, A.5 default), so a comparison isolates the dispatch rule:

* :class:`ClockworkClusterScheduler` — A.11.2 sim rule: when a GPU is free at t, over all models and all
  b ≤ |Q_M| with ``t + ℓ(b) ≤ d_min``, dispatch the batch with the earliest latest-executable moment
  ``LEM = d_min − ℓ(b)``; ties to the larger batch. Arbitrary batch sizes, as Symphony's authors allowed.
* :class:`ShepherdScheduler` — A.11.4: one candidate (the max feasible batch) per model; a free GPU
  runs the **largest** candidate; with no GPU free, a candidate at least ``preempt_factor`` (3) times
  the smallest running batch preempts it (Symphony §2.2). Preempted work is wasted; its requests are requeued
  (GETBATCH later drops those that can no longer finish), the spec's resolution of an unstated detail.

Interface: :class:`tessera.policy.serving.common.ClusterScheduler` (the same driving loop as
:class:`tessera.policy.serving.symphony.SymphonyScheduler`).
"""

from __future__ import annotations

import abc
import bisect
import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tessera.policy.serving.common import Batch, Drop, DropReason, LinearProfile, Request


@dataclass
class _Running:
    batch: Batch
    end: float


class _EagerCluster(abc.ABC):
    """Deadline queues per model, GPU free times, and GPU-free timers; subclasses pick the batch."""

    def __init__(self, profiles: Mapping[str, LinearProfile], n_gpus: int) -> None:
        if n_gpus < 1:
            raise ValueError(f"need at least one GPU, got {n_gpus}")
        if not profiles:
            raise ValueError("need at least one model profile")
        self.profiles = dict(profiles)
        self.gpu_free = [-math.inf] * n_gpus
        self._running: list[_Running | None] = [None] * n_gpus
        self._queues: dict[str, list[tuple[float, int, Request]]] = {m: [] for m in profiles}
        self._timers: list[tuple[float, int, int, int]] = []  # (time, seq, gpu, version)
        self._gpu_ver = [0] * n_gpus
        self._seq = itertools.count()
        self._drops: list[Drop] = []
        self._cancelled: list[tuple[Batch, float]] = []
        self._out: list[Batch] = []

    # -- queues ---------------------------------------------------------------------------------
    def _max_batch(self, m: str, now: float) -> int:
        """GETBATCH (A.5 default): drop heads that cannot finish alone, then the largest head batch."""
        prof, q = self.profiles[m], self._queues[m]
        k = 0
        while k < len(q) and now + prof(1) > q[k][0]:
            self._drops.append(Drop(q[k][2], now, DropReason.CANNOT_MEET_DEADLINE))
            k += 1
        if k:
            del q[:k]
        if not q:
            return 0
        d, n, cap = q[0][0], 1, min(len(q), prof.max_batch)
        while n < cap and now + prof(n + 1) <= d:
            n += 1
        return n

    def _start(self, m: str, n: int, g: int, now: float) -> None:
        q = self._queues[m]
        reqs = [e[2] for e in q[:n]]
        del q[:n]
        dur = self.profiles[m](n)
        b = Batch(reqs, g, now, dur, m)
        self.gpu_free[g] = now + dur
        self._running[g] = _Running(b, now + dur)
        self._gpu_ver[g] += 1
        heapq.heappush(self._timers, (now + dur, next(self._seq), g, self._gpu_ver[g]))
        self._out.append(b)

    @abc.abstractmethod
    def _choose(self, now: float) -> tuple[str, int] | None:
        """The (model, batch size) to start on a free GPU now, or None to leave it idle."""

    def _fill_free_gpus(self, now: float) -> None:
        for g in range(len(self.gpu_free)):
            if self.gpu_free[g] <= now:
                self._running[g] = None
                pick = self._choose(now)
                if pick is None:
                    return
                self._start(pick[0], pick[1], g, now)

    # -- interface ------------------------------------------------------------------------------
    def enqueue(self, request: Request, now: float) -> None:
        q = self._queues.get(request.model)
        if q is None:
            raise ValueError(f"request {request.rid} is for model {request.model!r}, not served here")
        bisect.insort(q, (request.deadline, request.rid, request), key=lambda e: (e[0], e[1]))
        self._on_arrival(now)

    def _on_arrival(self, now: float) -> None:
        self._fill_free_gpus(now)

    def advance(self, now: float, *, strictly_before: bool = False) -> list[Batch]:
        while self._timers and (
            self._timers[0][0] < now or (not strictly_before and self._timers[0][0] <= now)
        ):
            t, _, g, ver = heapq.heappop(self._timers)
            if ver == self._gpu_ver[g]:
                self._fill_free_gpus(t)
        out, self._out = self._out, []
        return out

    def next_timer(self) -> float | None:
        while self._timers and self._timers[0][3] != self._gpu_ver[self._timers[0][2]]:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def take_drops(self) -> list[Drop]:
        out, self._drops = self._drops, []
        return out

    def take_cancelled(self) -> list[tuple[Batch, float]]:
        out, self._cancelled = self._cancelled, []
        return out


class ClockworkClusterScheduler(_EagerCluster):
    """Clockwork as Symphony reimplemented it (A.11.2): earliest LEM over every feasible batch."""

    def _choose(self, now: float) -> tuple[str, int] | None:
        best: tuple[float, int, str] | None = None
        for m in self._queues:
            n = self._max_batch(m, now)
            if n == 0:
                continue
            # For one model LEM = d − ℓ(b) falls as b grows, so its earliest LEM is its largest batch.
            key = (self._queues[m][0][0] - self.profiles[m](n), -n, m)
            if best is None or key < best:
                best = key
        return None if best is None else (best[2], -best[1])


class ShepherdScheduler(_EagerCluster):
    """Shepherd-Flex (A.11.4): largest candidate first, preemption at ``preempt_factor`` × size."""

    def __init__(
        self, profiles: Mapping[str, LinearProfile], n_gpus: int, *, preempt_factor: float = 3.0
    ) -> None:
        super().__init__(profiles, n_gpus)
        if not preempt_factor > 1:
            raise ValueError(f"preempt_factor must be > 1, got {preempt_factor!r}")
        self.preempt_factor = preempt_factor
        self.preemptions = 0

    def _choose(self, now: float) -> tuple[str, int] | None:
        best: tuple[int, str] | None = None
        for m in self._queues:
            n = self._max_batch(m, now)
            if n and (best is None or n > best[0]):
                best = (n, m)
        return None if best is None else (best[1], best[0])

    def _on_arrival(self, now: float) -> None:
        if any(f <= now for f in self.gpu_free):
            self._fill_free_gpus(now)
            return
        pick = self._choose(now)
        if pick is None:
            return
        victims = [(r.batch.size, g) for g, r in enumerate(self._running) if r is not None]
        size, g = min(victims)
        if pick[1] < self.preempt_factor * size:
            return
        run = self._running[g]
        assert run is not None
        self._cancelled.append((run.batch, now))
        self.preemptions += 1
        self._start(pick[0], pick[1], g, now)
        for r in run.batch.requests:  # requeue; GETBATCH drops the ones that can no longer finish
            bisect.insort(self._queues[r.model], (r.deadline, r.rid, r), key=lambda e: (e[0], e[1]))
