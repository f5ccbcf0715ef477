"""Bisection controllers: Orion's SM_THRESHOLD search and the node agent's BE percentage `p_be`.

Orion, training HP (Orion §5.1.1): every window (10 HP iterations in the authors' code) compare the HP iteration
time with its limit; too slow → `high = thr`, else `low = thr`; `thr = (low + high) / 2`, starting from the
middle of `[0, max_sm_BE]`.

The node agent cannot gate single kernels; it caps every BE kernel with MPS' active-thread percentage, which a
BE process reads once at start. So `PBeController` bisects `p_be` on `[p_min, p_max]` toward
`p99_hp ≤ (1 + ε)·p99_dedicated`, and a new value is applied only when it differs from the applied one by at
least `hysteresis` points and `min_interval_s` has passed since the last change (each change restarts BE pods).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(slots=True)
class SmThresholdBisection:
    max_sm_be: int
    low: float = field(init=False, default=0.0)
    high: float = field(init=False)
    threshold: float = field(init=False)

    def __post_init__(self) -> None:
        if self.max_sm_be <= 0:
            raise ValueError(f"max_sm_be must be positive, got {self.max_sm_be}")
        self.high = float(self.max_sm_be)
        self.threshold = self.max_sm_be / 2

    def observe(self, hp_too_slow: bool) -> int:
        """One window's verdict; returns the new SM_THRESHOLD (integer SMs)."""
        if hp_too_slow:
            self.high = self.threshold
        else:
            self.low = self.threshold
        self.threshold = (self.low + self.high) / 2
        return int(self.threshold)


Reason = Literal["over-target", "under-target", "converged"]


@dataclass(frozen=True, slots=True)
class PBeDecision:
    """The controller's answer to one latency sample."""

    proposed: int  # the bisection's current point
    apply: int | None  # the percentage to apply now (restart BE pods), None to keep the current one
    reason: Reason
    why_not: str | None = None  # set when `proposed` differs from the applied value but is held back


@dataclass(slots=True)
class PBeController:
    """Bisect the BE active-thread percentage toward the HP latency target.

    `observe(now, p99_hp)` takes the HP p99 measured with the currently *applied* percentage. The search
    interval narrows each time; it reopens (to `[p_min, p_max]`) if the target drifts so far that a sample
    contradicts a bound (e.g. a new HP load), so the controller tracks changes rather than freezing.
    """

    p99_dedicated: float
    epsilon: float = 0.15
    p_min: int = 0
    p_max: int = 100
    initial: int = 50
    min_interval_s: float = 300.0
    hysteresis: int = 5  # points of percentage
    applied: int = field(init=False)
    low: float = field(init=False)
    high: float = field(init=False)
    last_change: float | None = field(init=False, default=None)
    changes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.p99_dedicated <= 0:
            raise ValueError(f"p99_dedicated must be positive, got {self.p99_dedicated}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be non-negative, got {self.epsilon}")
        if not 0 <= self.p_min < self.p_max <= 100:
            raise ValueError(f"need 0 <= p_min < p_max <= 100, got {self.p_min}, {self.p_max}")
        if not self.p_min <= self.initial <= self.p_max:
            raise ValueError(f"initial {self.initial} outside [{self.p_min}, {self.p_max}]")
        if self.min_interval_s < 0 or self.hysteresis < 0:
            raise ValueError("min_interval_s and hysteresis must be non-negative")
        self.applied = self.initial
        self.low, self.high = float(self.p_min), float(self.p_max)

    @property
    def target(self) -> float:
        return (1 + self.epsilon) * self.p99_dedicated

    def observe(self, now: float, p99_hp: float) -> PBeDecision:
        over = p99_hp > self.target
        reason: Reason = "over-target" if over else "under-target"
        p = float(self.applied)
        if over:
            if p <= self.low:  # contradicts the lower bound: the world changed, search again from below
                self.low = float(self.p_min)
            self.high = min(self.high, p)
        else:
            if p >= self.high:
                self.high = float(self.p_max)
            self.low = max(self.low, p)
        proposed = round((self.low + self.high) / 2)
        if over:  # a guaranteed step down: never stay at an over-target percentage
            proposed = min(proposed, self.applied - 1)
        proposed = max(self.p_min, min(self.p_max, proposed))
        delta = abs(proposed - self.applied)
        if delta == 0 or (delta < self.hysteresis and not over):
            return PBeDecision(proposed, None, "converged" if not over else reason)
        if self.last_change is not None and now - self.last_change < self.min_interval_s:
            wait = self.min_interval_s - (now - self.last_change)
            return PBeDecision(proposed, None, reason, f"minimum interval: {wait:.0f}s to go")
        self.applied = proposed
        self.last_change = now
        self.changes += 1
        return PBeDecision(proposed, proposed, reason)
