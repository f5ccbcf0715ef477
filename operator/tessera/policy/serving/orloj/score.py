"""Orloj's priority score, Orloj (Yu et al.) §4.1 Eq. (1)-(2), with bin *density* h (checked).

For a batch histogram with bins [l1, l2) of density h, step cost c, mean E[L] and anticipated-delay
rate b, a request with deadline D scores at time t

    p_i(t) = K (e^{b l2} − e^{b l1}) e^{−b(D−t)}      if t < D − l2
           = K − K e^{b l1} e^{−b(D−t)}               if D − l2 ≤ t < D − l1
           = 0                                        otherwise,          K = h c / (E[L] b).

Within one batch-size queue every request shares the histogram (§2.3), so the score depends only on
the slack s = D − t. :func:`scores_by_slack` evaluates Eq. 2 for many requests at once with a prefix sum
over bins, O(log bins) per request; it never forms e^{bt} so it cannot overflow. :func:`hull_coeffs` gives
the same score in the convex-hull form p = α·e^{b(t−t0)} + β of §2.1.4 with its next milestone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.policy.serving.orloj.batch_dist import BatchDistribution

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ScoreTable:
    """Precomputed per-bin constants for one L_B(k); bins must be disjoint and sorted."""

    l1: FloatArray
    l2: FloatArray
    K: FloatArray
    case1: FloatArray  # K (e^{b l2} − e^{b l1}) e^{−b l2}: case-1 term scaled to avoid overflow
    prefix: FloatArray  # prefix[j] = Σ_{i<j} case-1 weights relative to l2[j-1] … see scores_by_slack
    b: float

    @classmethod
    def build(cls, dist: BatchDistribution, *, b: float, cost: float = 1.0) -> ScoreTable:
        if not b > 0:
            raise ValueError(f"anticipated-delay rate b must be > 0, got {b!r}")
        K = dist.density * cost / (dist.mean * b)
        # Case-1 weight of bin i is K_i (e^{b l2} − e^{b l1}); keep it as K_i (1 − e^{−b(l2−l1)}) e^{b l2}
        # and store log-free partial sums relative to the top edge for stability.
        c1 = K * (-np.expm1(-b * (dist.l2 - dist.l1)))
        # prefix[j] = Σ_{i<j} c1_i e^{b (l2_i − l2_{j−1})}  (all exponents ≤ 0)
        prefix = np.zeros(dist.l1.size + 1)
        acc = 0.0
        for j in range(dist.l1.size):
            if j > 0:
                acc *= math.exp(-b * (dist.l2[j] - dist.l2[j - 1]))
            acc += c1[j]
            prefix[j + 1] = acc
        return cls(dist.l1.copy(), dist.l2.copy(), K, c1, prefix, b)


def score(table: ScoreTable, slack: float) -> float:
    """Eq. 2 for one request with slack s = D − t."""
    return float(scores_by_slack(table, np.array([slack], dtype=np.float64))[0])


def scores_by_slack(table: ScoreTable, slack: FloatArray) -> FloatArray:
    """Eq. 2 for many slacks at once (vectorised; exact, no e^{bt} overflow)."""
    b = table.b
    # Bins fully in case 1 are those with l2 < s; count them.
    n1 = np.searchsorted(table.l2, slack, side="left")  # bins with l2 < s  (s > l2 ⇔ t < D − l2)
    out = np.zeros_like(slack)
    has1 = n1 > 0
    j = n1[has1] - 1
    # Σ_{i<n1} K_i (e^{b l2_i} − e^{b l1_i}) e^{−b s} = prefix[n1] · e^{b (l2_{n1−1} − s)}
    out[has1] = table.prefix[n1[has1]] * np.exp(b * (table.l2[j] - slack[has1]))
    # A bin in case 2 has l1 < s ≤ l2: at most one (disjoint bins), the one at index n1.
    idx = np.minimum(n1, table.l1.size - 1)
    in2 = (n1 < table.l1.size) & (slack > table.l1[idx])
    k2 = idx[in2]
    out[in2] += table.K[k2] * (-np.expm1(-b * (slack[in2] - table.l1[k2])))
    return out


def hull_coeffs(
    dist: BatchDistribution, deadline: float, t: float, *, b: float, cost: float = 1.0, t0: float = 0.0
) -> tuple[float, float, float]:
    """(α, β, next milestone) with p(t) = α·e^{b(t−t0)} + β on the current piece (§2.1.4)."""
    K = dist.density * cost / (dist.mean * b)
    d = deadline - t0
    tr = t - t0
    alpha = beta = 0.0
    nxt = math.inf
    for l1, l2, k in zip(dist.l1, dist.l2, K, strict=True):
        if tr < d - l2:
            alpha += k * (math.exp(b * l2) - math.exp(b * l1)) * math.exp(-b * d)
            nxt = min(nxt, d - l2)
        elif tr < d - l1:
            alpha -= k * math.exp(b * l1) * math.exp(-b * d)
            beta += k
            nxt = min(nxt, d - l1)
    return alpha, beta, nxt + t0
