"""A wall clock the test moves, shared by the kmock and the real-cluster operator tests."""

from __future__ import annotations


class ManualClock:
    """Leases expire when the test advances this clock past them, whatever the machine's load."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
