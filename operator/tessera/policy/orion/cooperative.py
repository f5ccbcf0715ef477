"""The cooperative BE throttle's decision (node-agent design, Orion's DUR_THRESHOLD at module granularity).

A best-effort process that opts in checks, before each module's forward pass, whether it may launch more GPU
work: while the node's HP client is busy it keeps the expected duration of its outstanding (launched, not yet
completed) work at or below DUR_THRESHOLD, the same 2.5% of the HP request latency Orion uses (§5.1.1);
while the HP client is idle it only bounds how far it runs ahead (`idle_depth` modules), so that an HP request
arriving finds little BE work queued in front of it. Unlike Orion it cannot match compute/memory profiles per
kernel. Pure: the caller measures outstanding work (CUDA events) and reads the HP-busy signal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThrottleRule:
    threshold_s: float  # DUR_THRESHOLD in seconds (fraction × HP request latency)
    idle_depth: int = 12  # outstanding modules allowed while the HP client is idle

    def __post_init__(self) -> None:
        if self.threshold_s <= 0:
            raise ValueError(f"threshold_s must be positive, got {self.threshold_s}")
        if self.idle_depth < 1:
            raise ValueError(f"idle_depth must be at least 1, got {self.idle_depth}")

    def may_launch(self, hp_busy: bool, outstanding_s: float, outstanding_modules: int) -> bool:
        """True when the next module may be launched now; otherwise wait for outstanding work to finish."""
        if outstanding_modules == 0:
            return True  # nothing of ours is queued: waiting would only idle the GPU
        if hp_busy:
            return outstanding_s <= self.threshold_s
        return outstanding_modules < self.idle_depth

    @classmethod
    def for_hp_latency(
        cls, hp_latency_s: float, fraction: float = 0.025, idle_depth: int = 12
    ) -> ThrottleRule:
        return cls(fraction * hp_latency_s, idle_depth)
