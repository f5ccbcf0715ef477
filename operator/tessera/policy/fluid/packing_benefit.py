"""Choosing the packing degree c from measured per-iteration times (Fluid Eq. 3.1, dissertation §3.4.2).

    O_p = 1 − ((p − 1)/p) · avg(T^p) / avg(T^{p−1})        (p > 1)
    c   = argmax_p { O_p > O_th }

The seed gives no value for O_th [spec Part 5]; DEFAULT_THRESHOLD is ours and configurable.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_THRESHOLD = 0.05


def marginal_benefits(avg_iter_times: Sequence[float]) -> list[float]:
    """O_2..O_P from avg(T^1)..avg(T^P) (avg per-iteration time with p trials packed on one GPU)."""
    if len(avg_iter_times) == 0:
        raise ValueError("need at least the exclusive per-iteration time avg(T^1)")
    for p, t in enumerate(avg_iter_times, start=1):
        if t <= 0:
            raise ValueError(f"avg(T^{p}) must be > 0, got {t}")
    return [
        1.0 - ((p - 1) / p) * avg_iter_times[p - 1] / avg_iter_times[p - 2]
        for p in range(2, len(avg_iter_times) + 1)
    ]


def choose_packing_degree(avg_iter_times: Sequence[float], threshold: float = DEFAULT_THRESHOLD) -> int:
    """The largest p whose marginal benefit O_p is still above O_th (1 when O_2 is not).

    We stop at the first p that fails: past the inflection point the curve only diminishes (Fluid, dissertation §3.4.2).
    """
    c = 1
    for p, o in enumerate(marginal_benefits(avg_iter_times), start=2):
        if o > threshold:
            c = p
        else:
            break
    return c


def iter_times_from_alpha(t1: float, alpha: float, p_max: int) -> list[float]:
    """avg(T^p) under Eq. 3.2 (each packed trial's iteration slows by α per extra neighbour)."""
    return [t1 * alpha ** (p - 1) for p in range(1, p_max + 1)]
