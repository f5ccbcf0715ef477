"""The trial runtime model h_{i,w} of Eq. 3.2 (Fluid, dissertation §3.4.2; Lemmas 4 and 6).

h_{i,w} = h_{i,1} · α^{(1/w) − 1}     for w ∈ (0, 1)   (1/w trials packed on one GPU)
h_{i,w} = (h_{i,1} / w) · β^{w − 1}    for w ∈ [1, d]   (data-parallel over w GPUs)
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True, slots=True)
class RuntimeModel:
    """Packing slowdown α and scaling overhead β of one trial (1.0 = free packing / linear speed-up)."""

    alpha: float = 1.0
    beta: float = 1.0

    def __post_init__(self) -> None:
        if self.alpha < 1.0:
            raise ValueError(f"packing overhead alpha must be >= 1 (Eq. 3.2), got {self.alpha}")
        if self.beta < 1.0:
            raise ValueError(f"scaling overhead beta must be >= 1 (Eq. 3.2), got {self.beta}")

    def height(self, h1: float, width: Fraction | float) -> float:
        """Remaining runtime at width w, given the remaining runtime h1 on one whole GPU."""
        if width <= 0:
            raise ValueError(f"width must be > 0, got {width}")
        if h1 < 0:
            raise ValueError(f"remaining runtime must be >= 0, got {h1}")
        w = float(width)
        if w < 1.0:
            return float(h1 * self.alpha ** (1.0 / w - 1.0))
        return float(h1 / w * self.beta ** (w - 1.0))

    def check_ranges(self, c: int, d: int) -> None:
        """Lemma 4: α ∈ [1, c/(c−1)); Lemma 6: β ∈ [1, 1 + 1/d). Outside them packing/spreading hurts."""
        if c > 1 and self.alpha >= c / (c - 1):
            raise ValueError(
                f"alpha={self.alpha} makes packing {c} trials per GPU slower than running them in turn "
                f"(Lemma 4 needs alpha < c/(c-1) = {c / (c - 1):.4g}); lower c"
            )
        if d >= 1 and self.beta >= 1.0 + 1.0 / d:
            raise ValueError(
                f"beta={self.beta} makes {d} workers per trial slower than fewer (Lemma 6 needs beta < 1 + 1/d "
                f"= {1 + 1 / d:.4g}); lower d"
            )
