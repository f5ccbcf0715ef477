"""Per-application empirical execution-time histograms, learned online over a window.

Orloj (Yu et al.) §3.2 "Profiler": solo execution times of sampled requests are accumulated per
application; the memory is reset every window. Two windows are kept and swapped so the histogram is
never empty right after a reset. All histograms of one model share a uniform bin width ``w`` so batch
distributions can be combined bin by bin (§2.2.5 step 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


class CountHistogram:
    """Counts on the grid ``[i·w, (i+1)·w)``, i = 0, 1, …; grows as larger samples arrive."""

    def __init__(self, bin_width: float) -> None:
        if not bin_width > 0:
            raise ValueError(f"histogram bin width must be > 0, got {bin_width!r}")
        self.bin_width = bin_width
        self.counts: FloatArray = np.zeros(0, dtype=np.float64)

    @classmethod
    def from_samples(cls, samples: Iterable[float], bin_width: float) -> CountHistogram:
        h = cls(bin_width)
        h.add_many(samples)
        return h

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def add_many(self, samples: Iterable[float]) -> None:
        arr = np.asarray(list(samples), dtype=np.float64)
        if arr.size == 0:
            return
        if np.any(~np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError("execution-time samples must be finite and >= 0")
        idx = np.floor(arr / self.bin_width).astype(np.int64)
        need = int(idx.max()) + 1
        if need > self.counts.size:
            self.counts = np.concatenate([self.counts, np.zeros(need - self.counts.size)])
        np.add.at(self.counts, idx, 1.0)

    def add(self, sample: float) -> None:
        self.add_many([sample])

    def masses(self, n_bins: int) -> FloatArray:
        """Probability mass per bin, padded with zeros to ``n_bins``."""
        tot = self.total
        if tot <= 0:
            raise ValueError("histogram is empty")
        out = np.zeros(n_bins, dtype=np.float64)
        out[: self.counts.size] = self.counts / tot
        return out

    def cdf_at_edges(self, n_bins: int) -> FloatArray:
        """F at edges e_0 = 0, …, e_n_bins (length n_bins + 1); piecewise linear inside a bin."""
        return np.concatenate([[0.0], np.cumsum(self.masses(n_bins))])

    def mean(self) -> float:
        m = self.masses(self.counts.size)
        mids = (np.arange(m.size) + 0.5) * self.bin_width
        return float(np.dot(m, mids))

    def quantile(self, q: float) -> float:
        cdf = self.cdf_at_edges(self.counts.size)
        j = int(np.searchsorted(cdf, q, side="left"))
        j = min(max(j, 1), cdf.size - 1)
        lo, hi = cdf[j - 1], cdf[j]
        frac = 0.0 if hi <= lo else (q - lo) / (hi - lo)
        return float((j - 1 + frac) * self.bin_width)

    def merged(self, other: CountHistogram) -> CountHistogram:
        if other.bin_width != self.bin_width:
            raise ValueError("cannot merge histograms with different bin widths")
        n = max(self.counts.size, other.counts.size)
        out = CountHistogram(self.bin_width)
        out.counts = np.zeros(n)
        out.counts[: self.counts.size] += self.counts
        out.counts[: other.counts.size] += other.counts
        return out


class OnlineHistogram:
    """Windowed learning: ``current`` collects samples; every ``window`` it becomes ``previous`` and a
    fresh ``current`` starts (the paper's periodic reset, with two windows so it is never empty).

    ``prior`` (e.g. offline profiling or the CRD's prior) is used until ``min_samples`` observations exist.
    """

    def __init__(
        self,
        bin_width: float,
        *,
        window: float = 600.0,
        min_samples: int = 200,
        prior: CountHistogram | None = None,
        start: float = 0.0,
    ) -> None:
        if not window > 0:
            raise ValueError(f"profiling window must be > 0, got {window!r}")
        self.bin_width = bin_width
        self.window = window
        self.min_samples = min_samples
        self.prior = prior
        self.current = CountHistogram(bin_width)
        self.previous = CountHistogram(bin_width)
        self.window_start = start

    def observe(self, sample: float, now: float) -> None:
        self._roll(now)
        self.current.add(sample)

    def _roll(self, now: float) -> None:
        if now - self.window_start >= self.window:
            n = math.floor((now - self.window_start) / self.window)
            self.previous = self.current if n == 1 else CountHistogram(self.bin_width)
            self.current = CountHistogram(self.bin_width)
            self.window_start += n * self.window

    def snapshot(self, now: float) -> CountHistogram | None:
        """The histogram the scheduler should use now, or None if nothing is known yet."""
        self._roll(now)
        learned = self.current.merged(self.previous)
        if learned.total >= self.min_samples or (self.prior is None and learned.total > 0):
            return learned
        return self.prior
