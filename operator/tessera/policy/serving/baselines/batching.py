"""Batching baselines for one model on one worker, reduced from their public code as Orloj §5 compares
against them, plus Triton-style timeout batching. All plan with a point estimate of the batch time (the
mean solo time through the batching model), which is what Orloj contrasts itself with (§1, §2.3).

* :class:`ClockworkScheduler` — INFER5: per-batch-size FIFO queues, actions planned ahead with
  ``exec_at += estimate``; the worker rejects an action it cannot start by ``latest`` and every request
  in it fails. That window rule is the "fail every other batch" mechanism.
* :class:`NexusScheduler` — batch size planned from the mean rate, EDF queue with early drop.
* :class:`ClipperScheduler` — EDF, expired requests removed, batch size from a moving average of
  throughput × earliest slack, capped.
* :class:`TimeoutScheduler` — Triton's dynamic batcher: dispatch when ``max_batch`` requests wait or the
  oldest has waited ``max_queue_delay``; optionally drop requests whose deadline has passed.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.policy.serving.common import (
    Batch,
    BatchLatencyModel,
    BatchTimings,
    Drop,
    DropReason,
    Request,
)


class _EdfQueue:
    """Requests ordered by (deadline, arrival, id)."""

    def __init__(self) -> None:
        self._h: list[tuple[float, float, int, Request]] = []

    def push(self, r: Request) -> None:
        heapq.heappush(self._h, (r.deadline, r.arrival, r.rid, r))

    def peek(self) -> Request:
        return self._h[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._h)[3]

    def __len__(self) -> int:
        return len(self._h)


class _BatchingScheduler:
    def __init__(self, latency: BatchLatencyModel, mean_solo: float) -> None:
        if not mean_solo > 0:
            raise ValueError(f"mean solo execution time must be > 0, got {mean_solo!r}")
        self.latency = latency
        self.mean_solo = mean_solo
        self._drops: list[Drop] = []

    def estimate(self, k: int) -> float:
        return self.latency.latency(k, self.mean_solo)

    def take_drops(self) -> list[Drop]:
        out, self._drops = self._drops, []
        return out

    def next_wakeup(self, now: float) -> float | None:
        return None

    def on_complete(self, batch: Batch, timings: BatchTimings, now: float) -> None:
        return None


@dataclass
class _Action:
    requests: list[Request]
    earliest: float
    latest: float
    expected: float


class ClockworkScheduler(_BatchingScheduler):
    """Clockwork INFER5 reduced to one model and one worker (Clockwork's `infer5`). Constants in seconds.

    Each arrival goes into one FIFO queue per batch size. The controller plans actions while its
    predicted free time ``exec_at`` is within ``schedule_ahead`` of now; a request that leaves every
    queue untaken (too late for all sizes, or skipped by a later batch) has failed.
    """

    def __init__(
        self,
        latency: BatchLatencyModel,
        mean_solo: float,
        *,
        batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
        buffer: float = 0.005,
        schedule_ahead: float = 0.010,
        latest_delta: float = 0.010,
    ) -> None:
        super().__init__(latency, mean_solo)
        self.sizes = sorted(set(batch_sizes))
        self.buffer, self.schedule_ahead, self.latest_delta = buffer, schedule_ahead, latest_delta
        self._queues: dict[int, deque[tuple[int, float, int]]] = {b: deque() for b in self.sizes}
        self._live: dict[int, Request] = {}
        self._holders: dict[int, int] = {}
        self._seq = itertools.count()
        self._actions: deque[_Action] = deque()
        self._exec_at = -float("inf")

    def enqueue(self, request: Request, now: float) -> None:
        slo = request.deadline - request.arrival
        sched_dl = request.arrival + max(slo - self.buffer, self.schedule_ahead + self.buffer)
        s = next(self._seq)
        self._live[request.rid] = request
        self._holders[request.rid] = len(self._queues)
        for q in self._queues.values():
            q.append((s, sched_dl, request.rid))

    def _leave(self, rid: int, now: float) -> None:
        self._holders[rid] -= 1
        if self._holders[rid] == 0:
            del self._holders[rid]
            r = self._live.pop(rid, None)
            if r is not None:
                self._drops.append(Drop(r, now, DropReason.CANNOT_MEET_DEADLINE))

    def _front(self, b: int, now: float) -> tuple[int, float, int] | None:
        q = self._queues[b]
        while q and q[0][2] not in self._live:
            self._leave(q.popleft()[2], now)
        return q[0] if q else None

    def _try_dequeue(self, free_at: float, strategy_b: int, now: float) -> list[Request] | None:
        for b, q in self._queues.items():
            while (f := self._front(b, now)) is not None and f[1] < free_at + self.estimate(b):
                self._leave(q.popleft()[2], now)
        chosen = None
        for b in self.sizes:
            if sum(1 for e in self._queues[b] if e[2] in self._live) >= b:
                chosen = b
        if chosen is None or chosen < strategy_b:
            return None
        q = self._queues[chosen]
        taken: list[tuple[int, float, int]] = []
        while len(taken) < chosen:
            e = q.popleft()
            if e[2] in self._live:
                taken.append(e)
            else:
                self._leave(e[2], now)
        last = taken[-1][0]
        reqs = [self._live.pop(e[2]) for e in taken]
        for e in taken:
            self._leave(e[2], now)
        for qq in self._queues.values():  # everything at or before the last taken seqno fails
            while qq and qq[0][0] <= last:
                self._leave(qq.popleft()[2], now)
        return reqs

    def _plan(self, now: float) -> None:
        self._exec_at = max(self._exec_at, now)
        # The same expression next_wakeup returns, compared with <=: woken by its own timer at exactly
        # exec_at − schedule_ahead, the controller plans (a strict `exec_at < now + ahead` never held then).
        while self._exec_at - self.schedule_ahead <= now:
            strategies = sorted(
                (f[1] - self.estimate(b), b) for b in self.sizes if (f := self._front(b, now)) is not None
            )
            reqs = None
            for _, b in strategies:
                reqs = self._try_dequeue(self._exec_at, b, now)
                if reqs is not None:
                    break
            if reqs is None:
                break
            est = self.estimate(len(reqs))
            latest = max(now + 0.001 + self.latest_delta, self._exec_at + self.latest_delta)
            self._actions.append(_Action(reqs, now, latest, est))
            self._exec_at += est

    def next_batch(self, now: float, worker: int) -> Batch | None:
        self._plan(now)
        while self._actions:
            a = self._actions.popleft()
            if now > a.latest:  # the worker could not start it in its window: all requests fail
                for r in a.requests:
                    self._drops.append(Drop(r, now, DropReason.ACTION_REJECTED))
                self._plan(now)
                continue
            return Batch(a.requests, worker, now, a.expected, a.requests[0].model)
        return None

    def advance(self, now: float) -> None:
        """The controller's timer: plan actions once the predicted free time is near, even if the
        worker is in fact still busy with an overrunning batch."""
        self._plan(now)

    def next_wakeup(self, now: float) -> float | None:
        # A wake-up at or before now has been planned from already; only an arrival can add an action.
        wake = self._exec_at - self.schedule_ahead
        return wake if self._live and wake > now else None


class NexusScheduler(_BatchingScheduler):
    """Nexus (`uwsampl/nexus`): planned batch from the mean rate, EDF with early drop."""

    def __init__(
        self, latency: BatchLatencyModel, mean_solo: float, *, slo: float, rate: float, max_batch: int = 16
    ) -> None:
        super().__init__(latency, mean_solo)
        if not slo > 0 or not rate > 0:
            raise ValueError(f"Nexus needs slo > 0 and rate > 0, got slo={slo!r}, rate={rate!r}")
        self.plan_batch = self._plan(slo, rate, max_batch)
        self._q = _EdfQueue()

    def _plan(self, slo: float, rate: float, max_batch: int) -> int:
        feasible = [b for b in range(1, max_batch + 1) if self.estimate(b) <= slo / 2]
        if not feasible:
            return 1
        bmax = max(feasible)
        if rate >= bmax / self.estimate(bmax):
            return bmax
        ok = [b for b in range(1, max_batch + 1) if (b - 1) / rate + self.estimate(b) <= slo]
        return max(ok) if ok else 1

    def enqueue(self, request: Request, now: float) -> None:
        self._q.push(request)

    def next_batch(self, now: float, worker: int) -> Batch | None:
        expect = min(self.plan_batch, len(self._q))
        kept: list[Request] = []
        while self._q and len(kept) < expect:
            finish = now + self.estimate(expect)
            r = self._q.pop()
            if r.deadline < finish:
                self._drops.append(Drop(r, now, DropReason.EARLY_DROP))
                expect = min(expect, len(kept) + len(self._q))
            else:
                kept.append(r)
        if not kept:
            return None
        return Batch(kept, worker, now, self.estimate(len(kept)), kept[0].model)


class ClipperScheduler(_BatchingScheduler):
    """Clipper's open-source batcher (`ucbrise/clipper`): throughput moving average × earliest slack."""

    def __init__(
        self, latency: BatchLatencyModel, mean_solo: float, *, max_batch: int = 16, window: int = 100
    ) -> None:
        super().__init__(latency, mean_solo)
        self.max_batch = max_batch
        self._q = _EdfQueue()
        self._tput: deque[float] = deque([1 / self.estimate(1)], maxlen=window)

    def enqueue(self, request: Request, now: float) -> None:
        self._q.push(request)

    def next_batch(self, now: float, worker: int) -> Batch | None:
        while self._q and self._q.peek().deadline <= now:
            self._drops.append(Drop(self._q.pop(), now, DropReason.EXPIRED))
        if not self._q:
            return None
        avg = sum(self._tput) / len(self._tput)
        size = max(1, min(self.max_batch, int(avg * (self._q.peek().deadline - now))))
        reqs = [self._q.pop() for _ in range(min(size, len(self._q)))]
        return Batch(reqs, worker, now, self.estimate(len(reqs)), reqs[0].model)

    def on_complete(self, batch: Batch, timings: BatchTimings, now: float) -> None:
        dur = timings.finish - timings.start
        if dur > 0:
            self._tput.append(batch.size / dur)


class TimeoutScheduler(_BatchingScheduler):
    """Triton-style dynamic batching with ``max_queue_delay`` (FIFO; no deadline reasoning beyond
    optionally dropping requests that already expired)."""

    def __init__(
        self,
        latency: BatchLatencyModel,
        mean_solo: float,
        *,
        max_batch: int = 16,
        max_queue_delay: float = 0.005,
        drop_expired: bool = True,
    ) -> None:
        super().__init__(latency, mean_solo)
        if max_batch < 1 or max_queue_delay < 0:
            raise ValueError("timeout batching needs max_batch >= 1 and max_queue_delay >= 0")
        self.max_batch, self.max_queue_delay, self.drop_expired = max_batch, max_queue_delay, drop_expired
        self._q: deque[Request] = deque()

    def enqueue(self, request: Request, now: float) -> None:
        self._q.append(request)

    def next_batch(self, now: float, worker: int) -> Batch | None:
        if self.drop_expired:
            kept = deque(r for r in self._q if r.deadline > now)
            for r in self._q:
                if r.deadline <= now:
                    self._drops.append(Drop(r, now, DropReason.EXPIRED))
            self._q = kept
        if not self._q:
            return None
        if len(self._q) < self.max_batch and now < self._q[0].arrival + self.max_queue_delay:
            return None
        reqs = [self._q.popleft() for _ in range(min(self.max_batch, len(self._q)))]
        return Batch(reqs, worker, now, self.estimate(len(reqs)), reqs[0].model)

    def next_wakeup(self, now: float) -> float | None:
        return self._q[0].arrival + self.max_queue_delay if self._q else None
