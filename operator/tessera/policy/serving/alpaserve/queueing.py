"""Closed forms of AlpaServe §3.4: M/D/1 latency of simple versus pipelined
placement, and the largest overheads α (communication) and β (uneven stages) for which the pipeline
still wins (Fig. 10)."""

from __future__ import annotations

import math


def md1_latency(rate: float, service_s: float) -> float:
    """Mean sojourn time of an M/D/1 queue: W = D + λD²/(2(1 − λD))."""
    rho = rate * service_s
    if rho >= 1:
        return math.inf
    return service_s + rate * service_s**2 / (2 * (1 - rho))


def w_simple(total_rate: float, service_s: float, p: float = 0.5) -> float:
    """Two models on dedicated devices with rates pλ and (1−p)λ, averaged per request."""
    if not 0 <= p <= 1:
        raise ValueError(f"split p must be in [0, 1], got {p}")
    parts = [(p, p * total_rate), (1 - p, (1 - p) * total_rate)]
    return sum(w * md1_latency(r, service_s) for w, r in parts if w > 0)


def w_pipeline(total_rate: float, single_input_s: float, max_stage_s: float) -> float:
    """Merged Poisson stream through a pipeline: W = D_s + λD_m²/(2(1 − λD_m))."""
    rho = total_rate * max_stage_s
    if rho >= 1:
        return math.inf
    return single_input_s + total_rate * max_stage_s**2 / (2 * (1 - rho))


def beta_max(r: float) -> float:
    """Largest uneven-stage factor β at utilisation r = λD ∈ (0, 2): root of (4−2r)β² + 4rβ − 8 = 0."""
    if not 0 < r < 2:
        raise ValueError(f"utilisation r = λD must be in (0, 2), got {r}")
    return (r - math.sqrt(r * r - 4 * r + 8)) / (r - 2)


def alpha_max(r: float) -> float:
    """Largest communication factor α at r = λD ∈ (0, 2) (AlpaServe §3.4; queueing_theory_plot.py in the authors' code)."""
    if not 0 < r < 2:
        raise ValueError(f"utilisation r = λD must be in (0, 2), got {r}")
    disc = r**4 - 12 * r**3 + 56 * r**2 - 96 * r + 64
    return (r * r - 8 + math.sqrt(disc)) / (3 * (r * r - 2 * r))
