"""StaticFluid (Alg. 3.1 / Eq. B.1) and DynamicFluid (Alg. 3.2) widths. Spec §2.8 and §2.10.

Widths are exact fractions: 1/c for a packed trial, an integer in [1, d] for a whole-GPU trial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from tessera.policy.fluid.config import FluidConfig
from tessera.policy.fluid.runtime_model import RuntimeModel


def _check_heights(h1: Sequence[float]) -> None:
    for i, h in enumerate(h1):
        if not math.isfinite(h) or h < 0:
            raise ValueError(f"trial {i}: remaining single-GPU runtime h1 must be finite and >= 0, got {h}")


def water_fill(h1: Sequence[float], n: int, c: int, d: int) -> list[Fraction]:
    """Alg. 3.1 line 3 for every trial: w_i = min(max(⌊h_i / Σh · n⌋, 1/c), d).

    A zero floor means w*_i < 1, which Eq. B.1 maps to 1/c. Returned in input order.
    """
    _check_heights(h1)
    if n < 1:
        raise ValueError(f"need at least one GPU to plan on, got n={n}")
    if c < 1 or d < 1:
        raise ValueError(f"c and d must be >= 1, got c={c}, d={d}")
    # Exact rational arithmetic: a float h/Σh·n can land a hair under an integer and lose a GPU.
    exact = [Fraction(h) for h in h1]
    total = sum(exact, Fraction(0))
    if total <= 0:
        return [Fraction(1, c) for _ in h1]
    out: list[Fraction] = []
    for h in exact:
        share = math.floor(h * n / total)
        out.append(Fraction(min(share, d)) if share >= 1 else Fraction(1, c))
    return out


def static_widths(h1: Sequence[float], n: int, config: FluidConfig) -> list[Fraction]:
    """StaticFluid (Alg. 3.1): widths of a new TrialGroup on n idle GPUs."""
    return water_fill(h1, n, config.c, config.d)


def planning_order(h1: Sequence[float]) -> list[int]:
    """Alg. 3.1 line 1: indices by h_{i,1} non-increasing (stable, so ties keep input order)."""
    return sorted(range(len(h1)), key=lambda i: -h1[i])


class Rule(Enum):
    KEEP = "keep"
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    START = "start"  # a trial with no resources yet takes w'


@dataclass(frozen=True, slots=True)
class Rescale:
    index: int
    current: Fraction
    proposed: Fraction
    rule: Rule

    @property
    def width(self) -> Fraction:
        return self.current if self.rule == Rule.KEEP else self.proposed


def dynamic_rescale(
    current: Sequence[Fraction],
    h1_remaining: Sequence[float],
    n: int,
    config: FluidConfig,
    models: Sequence[RuntimeModel] | None = None,
) -> list[Rescale]:
    """DynamicFluid (Alg. 3.2) over the group's total resources M (n = |M|).

    Recomputes w' with Alg. 3.1's formula on the remaining runtimes, then per trial (in non-increasing h
    order) accepts w' only if it pays for its reconfiguration cost ε:
      scale up:   h_{w'} + ε < h_w
      scale down: w'·(h_{w'} + ε) < w·h_w           (the GPU-time area must shrink)
    Algorithm 3.2's lines 5 and 7 read "Update a_i with w_i"; the text of §3.4.3 says w_i ← w'_i,
    which we apply. A current width of 0 means the trial holds nothing yet (Rule.START).
    """
    if len(current) != len(h1_remaining):
        raise ValueError("current widths and remaining runtimes must have the same length")
    if models is not None and len(models) != len(current):
        raise ValueError("need one RuntimeModel per trial")
    proposed = water_fill(h1_remaining, n, config.c, config.d)
    out: list[Rescale] = []
    for i in planning_order(h1_remaining):
        m = models[i] if models is not None else RuntimeModel()
        w, w2 = current[i], proposed[i]
        out.append(Rescale(i, w, w2, rescale_rule(h1_remaining[i], w, w2, m, config.epsilon)))
    return out


def rescale_rule(
    h1: float, current: Fraction, proposed: Fraction, model: RuntimeModel, epsilon: float
) -> Rule:
    """Alg. 3.2 lines 4–7 for one trial: does moving from width `current` to `proposed` pay for ε?"""
    if current <= 0:
        return Rule.START
    if proposed > current and model.height(h1, proposed) + epsilon < model.height(h1, current):
        return Rule.SCALE_UP
    if proposed < current and float(proposed) * (model.height(h1, proposed) + epsilon) < float(
        current
    ) * model.height(h1, current):
        return Rule.SCALE_DOWN
    return Rule.KEEP


def plan_makespan(h1: Sequence[float], widths: Sequence[Fraction], models: Sequence[RuntimeModel]) -> float:
    """Estimated makespan max_i h_{i,w_i} when every trial runs at once (the status estimate of Part 3.2)."""
    return max((m.height(h, w) for h, w, m in zip(h1, widths, models, strict=True)), default=0.0)
