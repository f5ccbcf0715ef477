"""Symphony on GPUs shared with best-effort lanes (the node-agent design's Symphony interaction).

Symphony's window `exec = d − ℓ(|B|+1)` holds only if a batch takes ℓ(b). A worker whose GPU also runs BE
lanes (MPS, the HP lane at client priority 0) runs slower, so the dispatcher must plan with the colocated
profile, or with the dedicated one multiplied by the observed inflation (HP p99 colocated / dedicated);
otherwise batches start too late for their deadlines and drops appear. BE work never enters Symphony's own
busy time: the GPU clocks it keeps are the HP batches it dispatched, so the autoscaler's idle fraction
counts only HP work and BE load does not block scale-down.
"""

from __future__ import annotations

import math

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
