"""The workload W: a time-sorted list of requests ``(arrival, model, slo)`` (AlpaServe §4.2).

Arrivals come in as arrays (generated, fitted or replayed elsewhere); this module only merges and
slices them. Ties in arrival time break by model order so merging is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Workload:
    model_names: tuple[str, ...]
    arrivals: FloatArray
    models: IntArray  # index into model_names
    slos: FloatArray

    def __post_init__(self) -> None:
        n = len(self.arrivals)
        if len(self.models) != n or len(self.slos) != n:
            raise ValueError("workload arrays (arrivals, models, slos) must have equal length")
        if n and np.any(np.diff(self.arrivals) < 0):
            raise ValueError("workload arrivals must be sorted by time")
        if n and (self.models.min() < 0 or self.models.max() >= len(self.model_names)):
            raise ValueError("workload model index out of range of model_names")
        if n and np.any(self.slos <= 0):
            raise ValueError("every request needs a positive SLO")

    @classmethod
    def from_streams(
        cls, streams: Mapping[str, Sequence[float] | FloatArray], slo_s: Mapping[str, float]
    ) -> Workload:
        """Merge one arrival array per model; ``slo_s[m]`` is model m's latency deadline (s)."""
        names = tuple(streams)
        missing = [m for m in names if m not in slo_s]
        if missing:
            raise ValueError(f"no SLO given for models {missing}")
        parts_t = [np.asarray(streams[m], dtype=np.float64) for m in names]
        parts_m = [np.full(len(t), i, dtype=np.int64) for i, t in enumerate(parts_t)]
        t = np.concatenate(parts_t) if parts_t else np.zeros(0)
        mi = np.concatenate(parts_m) if parts_m else np.zeros(0, dtype=np.int64)
        order = np.lexsort((mi, t))
        t, mi = t[order], mi[order]
        slo = np.array([slo_s[names[i]] for i in mi], dtype=np.float64)
        return cls(names, t, mi, slo)

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def duration_s(self) -> float:
        return float(self.arrivals[-1] - self.arrivals[0]) if len(self) > 1 else 0.0

    def counts(self) -> dict[str, int]:
        c = np.bincount(self.models, minlength=len(self.model_names))
        return {m: int(c[i]) for i, m in enumerate(self.model_names)}

    def rates(self, horizon_s: float | None = None) -> dict[str, float]:
        h = horizon_s if horizon_s is not None else max(self.duration_s, 1e-9)
        return {m: n / h for m, n in self.counts().items()}

    def _subset(self, mask: npt.NDArray[np.bool_]) -> Workload:
        return Workload(self.model_names, self.arrivals[mask], self.models[mask], self.slos[mask])

    def window(self, start_s: float, end_s: float) -> Workload:
        """Requests with ``start_s ≤ arrival < end_s``."""
        return self._subset((self.arrivals >= start_s) & (self.arrivals < end_s))

    def only(self, models: Sequence[str]) -> Workload:
        """Requests for ``models`` only: a bucket's share of W (AlpaServe §4.2)."""
        keep = [self.model_names.index(m) for m in models if m in self.model_names]
        return self._subset(np.isin(self.models, keep))
