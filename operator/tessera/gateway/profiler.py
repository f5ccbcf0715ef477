"""The online profiler that feeds Orloj's per-application histograms (Orloj §3.2).

Solo execution time cannot be measured inside a batch, so a sample of finished requests is re-run alone
on a worker that has nothing else to do, and the measured solo times are handed to the scheduler through
``on_complete`` (the interface's channel for profiled members). Orloj leaves the rates open; Tessera's
defaults: sample 2% of finished requests, and keep profiling under 5% of the time workers spend on batches.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.policy.serving.common import Request


@dataclass(frozen=True)
class CapturedRequest:
    request: Request
    body: bytes  # the request as the client sent it (its JSON part), to re-run alone
    blob: bytes = b""  # its binary tensor bytes, if it brought any


class OnlineProfiler:
    """Chooses which finished requests to re-run alone, and when profiling may use a worker."""

    def __init__(self, sample_rate: float, max_share: float, max_pending: int, rng: random.Random) -> None:
        if not 0 <= sample_rate <= 1 or not 0 <= max_share <= 1:
            raise ValueError(f"sample_rate and max_share must be in [0, 1], got {sample_rate}, {max_share}")
        self.sample_rate, self.max_share = sample_rate, max_share
        self.rng = rng
        self._pending: deque[CapturedRequest] = deque(maxlen=max_pending)
        self.batch_seconds = 0.0
        self.profile_seconds = 0.0
        self.profiled = 0

    @property
    def enabled(self) -> bool:
        return self.sample_rate > 0

    def offer(self, finished: Sequence[CapturedRequest], batch_seconds: float) -> None:
        """A batch finished after ``batch_seconds``: sample its members for solo re-execution."""
        self.batch_seconds += batch_seconds
        if not self.enabled:
            return
        for s in finished:
            if self.rng.random() < self.sample_rate:
                self._pending.append(s)  # the oldest sample falls out when full: fresher data wins

    def take(self, n: int) -> list[CapturedRequest]:
        """Up to ``n`` samples to profile now, or none while profiling is over its share of worker time."""
        if not self._pending or self.profile_seconds > self.max_share * self.batch_seconds:
            return []
        return [self._pending.popleft() for _ in range(min(n, len(self._pending)))]

    def record(self, seconds: float, count: int) -> None:
        self.profile_seconds += seconds
        self.profiled += count
