"""Shared types for the serving policies: requests, batches, drops, latency models, and the
batch-scheduler interface that the simulator and the gateway drive.

Time is whatever unit the caller uses consistently (the simulator uses seconds); nothing here reads
a clock.

The batch-scheduler interface (:class:`BatchScheduler`) is one stateful object per served model
(Orloj, Clockwork, Nexus, Clipper, timeout batching) or per scheduler shard (Symphony, which matches
many models to many GPUs and so uses :class:`ClusterScheduler`):

* ``enqueue(request, now)`` — a request arrived (its deadline is already stamped).
* ``next_batch(now, worker) -> Batch | None`` — ``worker`` can take a batch now; return the batch to run
  or ``None`` to leave it idle. Requests the scheduler gives up on are not returned silently: they are
  recorded as :class:`Drop` with a :class:`DropReason` and handed out by ``take_drops()``.
* ``on_complete(batch, timings, now)`` — the batch finished; ``timings`` carries the measured batch time
  and the solo execution times of the members the worker profiled, which feed online learning.
* ``next_wakeup(now) -> float | None`` — the earliest future time at which ``next_batch`` could return a
  batch even without a new arrival or completion (timeout batchers need this); ``None`` for never.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class Request:
    """One inference request. ``solo_time`` is its execution time when run alone: known to a simulator
    (to compute batch times) but never read by a scheduler, which only sees it after profiling."""

    rid: int
    model: str
    arrival: float
    deadline: float
    app: str = "default"
    solo_time: float = 0.0

    def __post_init__(self) -> None:
        if self.deadline < self.arrival:
            raise ValueError(
                f"request {self.rid}: deadline {self.deadline} is before its arrival {self.arrival}"
            )


@dataclass(slots=True)
class Batch:
    """A batch handed to a worker: run ``requests`` together, starting at ``start`` (≥ the decision
    time; Symphony may schedule a start slightly in the future), expected to take ``expected_latency``."""

    requests: list[Request]
    worker: int
    start: float
    expected_latency: float
    model: str = ""

    @property
    def size(self) -> int:
        return len(self.requests)


@dataclass(slots=True)
class BatchTimings:
    """What a worker observed: when the batch ran, and solo times of profiled members (rid -> time)."""

    start: float
    finish: float
    solo_times: Mapping[int, float] = field(default_factory=dict)


class DropReason(enum.Enum):
    CANNOT_MEET_DEADLINE = "cannot-meet-deadline"  # no batch size can finish it in time (Orloj line 14)
    EXPIRED = "expired"  # deadline already passed while queued (Clipper, Triton queue policy)
    EARLY_DROP = "early-drop"  # dropped to keep the planned batch size (Nexus)
    ACTION_REJECTED = "action-rejected"  # worker could not start the planned action in its window (Clockwork)
    EXCESS = "excess"  # beyond the batch a backend was assigned (Nexus, Symphony baselines)


@dataclass(frozen=True, slots=True)
class Drop:
    request: Request
    time: float
    reason: DropReason


class BatchScheduler(Protocol):
    """Per-model batch scheduler driven by a worker loop (see the module docstring)."""

    def enqueue(self, request: Request, now: float) -> None: ...

    def next_batch(self, now: float, worker: int) -> Batch | None: ...

    def on_complete(self, batch: Batch, timings: BatchTimings, now: float) -> None: ...

    def take_drops(self) -> list[Drop]: ...

    def next_wakeup(self, now: float) -> float | None: ...


@dataclass(frozen=True, slots=True)
class BatchLatencyModel:
    """Batch execution time of a dynamic model, Orloj (Yu et al.) §4.2 Eq. (3)-(4) generalised:

    ``l_B(k) = a_k + s_k · max_{r∈B} l_r`` with ``a_k = a0 + a1·k`` and ``s_k = s0 + s1·k``, or
    explicit per-batch-size coefficients in ``table`` (k -> (a_k, s_k)), which win where given.
    Eq. (3) is ``a0 = c0, s1 = c1`` (see :meth:`eq3`).
    """

    a0: float = 0.0
    a1: float = 0.0
    s0: float = 0.0
    s1: float = 1.0
    table: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def eq3(cls, c0: float, c1: float) -> BatchLatencyModel:
        """The paper-literal Eq. (3): l_B = c0 + c1·k·l."""
        return cls(a0=c0, a1=0.0, s0=0.0, s1=c1)

    def coeffs(self, k: int) -> tuple[float, float]:
        if k < 1:
            raise ValueError(f"batch size must be >= 1, got {k}")
        if k in self.table:
            return self.table[k]
        return self.a0 + self.a1 * k, self.s0 + self.s1 * k

    def latency(self, k: int, longest_solo: float) -> float:
        a, s = self.coeffs(k)
        return a + s * longest_solo

    def batch_time(self, solo_times: Sequence[float]) -> float:
        """Actual time of a batch whose members take ``solo_times`` alone (padded to the longest, Eq. 4)."""
        if not solo_times:
            raise ValueError("a batch needs at least one request")
        return self.latency(len(solo_times), max(solo_times))


@dataclass(frozen=True, slots=True)
class LinearProfile:
    """Static-model latency ℓ(b) = α·b + β (Symphony §2.1), optionally overridden per batch size by
    a measured ``table`` (kept monotone). ``max_batch`` caps the batch size the model supports."""

    alpha: float
    beta: float
    max_batch: int = 512
    table: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"latency profile needs alpha, beta >= 0, got {self.alpha}, {self.beta}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")

    def __call__(self, b: int) -> float:
        if b in self.table:
            return self.table[b]
        return self.alpha * b + self.beta


class ClusterScheduler(Protocol):
    """A scheduler that matches many models' requests to many GPUs (Symphony and its baselines).

    ``advance(now)`` fires every internal timer due by ``now`` and returns the batches dispatched
    (``Batch.worker`` is the GPU, ``Batch.start`` its start); ``next_timer()`` says when to call it next.
    Batches a scheduler later cancels (Shepherd's preemption) are handed out by ``take_cancelled()``
    as ``(batch, time)``; their requests are requeued or dropped by the scheduler itself.
    """

    def enqueue(self, request: Request, now: float) -> None: ...

    def advance(self, now: float, *, strictly_before: bool = False) -> list[Batch]: ...

    def next_timer(self) -> float | None: ...

    def take_drops(self) -> list[Drop]: ...
