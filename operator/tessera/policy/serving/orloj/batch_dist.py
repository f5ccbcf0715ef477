"""Batch execution-time distributions L_B(k) from per-application histograms.

Orloj (Yu et al.) §4.2: the batch runs as long as its longest member (Eq. 4) scaled by the batching model
(Eq. 3, generalised to per-batch-size a_k, s_k). For independent members the CDF of the max is the
product of the members' CDFs (§2.2.3: Eq. 8 is Ryser's formula for d/dl Π F_i), computed at bin
edges with F linear inside a bin (§2.2.5 steps 3-6). Which distribution fills each of the k slots is
the mixing mode (§2.2.5): ``round_robin`` (default, paper-literal), ``iid_mixture`` or ``weighted``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.policy.serving.common import BatchLatencyModel
from tessera.policy.serving.orloj.histogram import CountHistogram

FloatArray = npt.NDArray[np.float64]


class MixMode(enum.Enum):
    ROUND_ROBIN = "round_robin"
    IID_MIXTURE = "iid_mixture"
    WEIGHTED = "weighted"


@dataclass(frozen=True)
class BatchDistribution:
    """Histogram of L_B(k): bins [l1, l2) with probability ``mass`` and ``density = mass/(l2 − l1)``."""

    k: int
    l1: FloatArray
    l2: FloatArray
    mass: FloatArray
    mean: float

    @property
    def density(self) -> FloatArray:
        return self.mass / (self.l2 - self.l1)

    def quantile(self, q: float) -> float:
        cdf = np.cumsum(self.mass)
        j = int(np.searchsorted(cdf, q - 1e-12, side="left"))
        return float(self.l2[min(j, self.l2.size - 1)])


def max_cdf(cdfs: list[FloatArray]) -> FloatArray:
    """CDF of the maximum of independent variables, at shared bin edges: Π_i F_i (§2.2.3)."""
    out = np.ones_like(cdfs[0])
    for f in cdfs:
        out = out * f
    return out


def batch_distribution(
    k: int,
    histograms: Mapping[str, CountHistogram],
    latency: BatchLatencyModel,
    *,
    mode: MixMode = MixMode.ROUND_ROBIN,
    weights: Mapping[str, float] | None = None,
) -> BatchDistribution:
    """L_B(k) for a batch of ``k`` drawn from the model's applications (§2.2.5 steps 2-6)."""
    if not histograms:
        raise ValueError("batch distribution needs at least one application histogram")
    widths = {h.bin_width for h in histograms.values()}
    if len(widths) != 1:
        raise ValueError(f"application histograms must share one bin width, got {sorted(widths)}")
    w = widths.pop()
    n_bins = max(h.counts.size for h in histograms.values())
    apps = sorted(histograms)
    cdfs = {a: histograms[a].cdf_at_edges(n_bins) for a in apps}
    if mode is MixMode.ROUND_ROBIN:
        slots = [cdfs[apps[j % len(apps)]] for j in range(k)]
        phi = max_cdf(slots)
    else:
        if mode is MixMode.WEIGHTED:
            if weights is None:
                raise ValueError("mix mode 'weighted' needs application weights")
            ws = np.array([max(0.0, float(weights.get(a, 0.0))) for a in apps])
            if ws.sum() <= 0:
                raise ValueError("application weights must have a positive sum")
        else:
            ws = np.ones(len(apps))
        ws = ws / ws.sum()
        mix = sum((wt * cdfs[a] for wt, a in zip(ws, apps, strict=True)), np.zeros(n_bins + 1))
        phi = mix**k
    mass = np.diff(phi)
    keep = mass > 1e-15
    edges = np.arange(n_bins + 1, dtype=np.float64) * w
    a_k, s_k = latency.coeffs(k)
    if s_k <= 0:
        raise ValueError(f"batching slope s_k must be > 0 (k={k}, got {s_k})")
    l1 = (a_k + s_k * edges[:-1])[keep]
    l2 = (a_k + s_k * edges[1:])[keep]
    m = mass[keep] / mass[keep].sum()
    return BatchDistribution(k, l1, l2, m, float(np.dot(m, (l1 + l2) / 2)))
