"""Dynamic-DNN workloads shaped as in Orloj's evaluation (§5): each mode of the execution-time
distribution is one application (normal, σ = 5 ms by default, modes evenly spaced on [50, 100] ms,
equal shares); a static model is one narrow mode. Load is a fraction of 8/E[L_B(8)], the model's
sustainable throughput at batch 8 under the mean-based estimate; the SLO is a multiple of the P99 of
solo times. Arrivals are Poisson or Gamma with a CV (see :mod:`tessera.sim.serving.arrivals`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.policy.serving.common import BatchLatencyModel, Request
from tessera.sim.serving.arrivals import gamma_arrivals


@dataclass(frozen=True)
class DynamicModel:
    """A model whose solo time is a mixture of normal modes, one per application (seconds)."""

    modes: tuple[float, ...]
    sigma: float
    latency: BatchLatencyModel

    @classmethod
    def evenly_spaced(
        cls,
        n_modes: int,
        *,
        low: float = 0.050,
        high: float = 0.100,
        sigma: float = 0.005,
        latency: BatchLatencyModel | None = None,
    ) -> DynamicModel:
        if n_modes < 1:
            raise ValueError(f"need at least one mode, got {n_modes}")
        modes = (0.5 * (low + high),) if n_modes == 1 else tuple(np.linspace(low, high, n_modes))
        return cls(modes, sigma, latency or BatchLatencyModel(s0=0.8, s1=0.2))

    @property
    def apps(self) -> list[str]:
        return [f"app{i}" for i in range(len(self.modes))]

    def sample(self, app_index: int, n: int, rng: np.random.Generator) -> np.ndarray:
        x = rng.normal(self.modes[app_index], self.sigma, n)
        return np.clip(x, 0.2 * self.modes[app_index], None)

    def solo_p99(self, rng: np.random.Generator, n: int = 20000) -> float:
        samples = np.concatenate([self.sample(k, n // len(self.modes), rng) for k in range(len(self.modes))])
        return float(np.quantile(samples, 0.99))

    def mean_solo(self) -> float:
        return float(np.mean(self.modes))

    def throughput_at(self, k: int, n: int = 4000) -> float:
        """k / E[L_B(k)] with batch members drawn uniformly from the applications: the load reference
        of §6.6 (estimated with a fixed-seed Monte Carlo of the batch maximum)."""
        rng = np.random.default_rng(12345)
        apps = rng.integers(0, len(self.modes), (n, k))
        solo = rng.normal(np.asarray(self.modes)[apps], self.sigma).clip(0.2 * min(self.modes))
        return k / float(np.mean([self.latency.latency(k, m) for m in solo.max(axis=1)]))


def make_requests(
    model: DynamicModel,
    *,
    n: int,
    load: float,
    slo: float,
    rng: np.random.Generator,
    cv: float = 1.0,
    name: str = "model",
) -> list[Request]:
    """``n`` requests at ``load × 8/E[L_B(8)]``; each picks an application uniformly (equal shares)."""
    rate = load * model.throughput_at(8)
    arr = gamma_arrivals(rate, cv, n / rate * 1.5 + 10.0, rng)[:n]
    if arr.size < n:
        raise ValueError("arrival process produced too few requests; raise the duration")
    apps = rng.integers(0, len(model.modes), n)
    out = []
    for rid, (t, a) in enumerate(zip(arr.tolist(), apps.tolist(), strict=True)):
        solo = float(model.sample(a, 1, rng)[0])
        out.append(Request(rid, name, t, t + slo, model.apps[a], solo))
    return out
