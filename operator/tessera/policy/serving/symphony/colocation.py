"""Symphony on GPUs shared with best-effort lanes (the node-agent design's Symphony interaction).

Symphony's window `exec = d − ℓ(|B|+1)` holds only if a batch takes ℓ(b). A worker whose GPU also runs BE
lanes (MPS, the HP lane at client priority 0) runs slower, so the dispatcher must plan with the colocated
profile, or with the dedicated one multiplied by the observed inflation (HP p99 colocated / dedicated);
otherwise batches start too late for their deadlines and drops appear. BE work never enters Symphony's own
busy time: the GPU clocks it keeps are the HP batches it dispatched, so the autoscaler's idle fraction
counts only HP work and BE load does not block scale-down.

`InflationTracker` measures the inflation online, for a gateway that does not know whether (or how hard)
BE lanes share its workers' GPUs: each batch's measured time over the dedicated ℓ(b) is one sample, and
the p99 of the last `window` samples is the observed inflation. A new value is reported only when it
leaves a relative band around the one in use, so the plan is not rebuilt on noise.
"""

from __future__ import annotations

import math
from collections import deque

from tessera.policy.serving.common import LinearProfile


def observed_inflation(p99_colocated: float, p99_dedicated: float) -> float:
    """HP p99 colocated over dedicated, never below 1 (sharing never makes the HP lane faster)."""
    if not (math.isfinite(p99_dedicated) and p99_dedicated > 0):
        raise ValueError(f"dedicated p99 must be a positive number, got {p99_dedicated!r}")
    if not (math.isfinite(p99_colocated) and p99_colocated >= 0):
        raise ValueError(f"colocated p99 must be a non-negative number, got {p99_colocated!r}")
    return max(1.0, p99_colocated / p99_dedicated)


def colocated_profile(profile: LinearProfile, inflation: float) -> LinearProfile:
    """ℓ_colocated(b) = inflation · ℓ(b), measured table entries included."""
    if not (math.isfinite(inflation) and inflation >= 1.0):
        raise ValueError(f"colocation inflation must be a number >= 1, got {inflation!r}")
    return LinearProfile(
        profile.alpha * inflation,
        profile.beta * inflation,
        max_batch=profile.max_batch,
        table={b: t * inflation for b, t in profile.table.items()},
    )


class InflationTracker:
    """The observed inflation of a dedicated profile, from batch times measured on the workers.

    `start`: the inflation in use before any sample (a configured one, or 1); `min_samples` batches are
    needed before a measured value replaces it; `band`: relative change a new value must exceed.
    """

    def __init__(
        self,
        dedicated: LinearProfile,
        *,
        start: float = 1.0,
        window: int = 256,
        min_samples: int = 50,
        band: float = 0.1,
        quantile: float = 0.99,
    ) -> None:
        if not 1 <= min_samples <= window:
            raise ValueError(f"min_samples must be in 1..window ({window}), got {min_samples}")
        if not (math.isfinite(band) and band >= 0):
            raise ValueError(f"band must be a non-negative number, got {band!r}")
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
        colocated_profile(dedicated, start)  # validates start
        self.dedicated = dedicated
        self.current = start
        self.min_samples = min_samples
        self.band = band
        self.quantile = quantile
        self._ratios: deque[float] = deque(maxlen=window)

    def estimate(self) -> float | None:
        """The p-quantile (nearest rank) of the window's ratios, at least 1; None with too few samples."""
        n = len(self._ratios)
        if n < self.min_samples:
            return None
        ranked = sorted(self._ratios)
        return max(1.0, ranked[min(n - 1, math.ceil(self.quantile * n) - 1)])

    def observe(self, batch_size: int, seconds: float) -> float | None:
        """Record one batch of `batch_size` that took `seconds`; the new inflation when it left the band
        around the current one (then current), else None."""
        expected = self.dedicated(batch_size)
        if not (expected > 0 and math.isfinite(seconds) and seconds >= 0):
            return None  # nothing to compare against (a zero-cost profile) or a bad measurement
        self._ratios.append(seconds / expected)
        est = self.estimate()
        if est is None or abs(est - self.current) <= self.band * self.current:
            return None
        self.current = est
        return est
