"""StaticFluid's makespan bound (Theorems 1–2, Lemmas 1–3 and 5–7; Fluid, dissertation §3.4.2 and Appendix B).

The seed closes B.7 with "= 2·OPT(I)", which does not follow; what the lemmas prove is
    makespan < max( 2·H_small + max_x h_{x,1/c},  2·H · β^{1/(β−1) − 1} )
with H = Σ_i h_{i,1} / n and H_small = Σ_x h_{x,1} / (n − Σ_y w_y) over the packed set x and whole-GPU set y.
Lemma 3 assumes the d cap does not bind; `d_binds` tells the caller when it does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from tessera.policy.fluid.runtime_model import RuntimeModel


def d_binds(h1: Sequence[float], n: int, d: int) -> bool:
    total = math.fsum(h1)
    return total > 0 and any(math.floor(h / total * n) > d for h in h1)


def static_bound(
    h1: Sequence[float], widths: Sequence[Fraction], n: int, model: RuntimeModel | None = None
) -> float:
    """Upper bound on StaticFluid's makespan for a plan `widths` on n GPUs (B.15 / Eq. 3.3 form)."""
    m = model or RuntimeModel()
    if len(h1) != len(widths):
        raise ValueError("need one width per trial")
    big = sum(int(w) for w in widths if w >= 1)
    small = [(h, w) for h, w in zip(h1, widths, strict=True) if w < 1]
    big_term = 2.0 * math.fsum(h1) / n
    if m.beta > 1.0:
        big_term *= m.beta ** (1.0 / (m.beta - 1.0) - 1.0)
    if not small:
        return big_term
    if big >= n:
        raise ValueError("packed trials but no GPU left for them: not a StaticFluid plan")
    h_small = math.fsum(h for h, _ in small) / (n - big)
    return max(2.0 * h_small + max(m.height(h, w) for h, w in small), big_term)
