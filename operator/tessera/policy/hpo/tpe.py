"""A TPE-style model over completed trials, as BOHB's config sampler (Falkner et al. 2018, simplified).

Differences from the original BOHB: independent per-dimension Gaussian Parzen estimators (a product
kernel) instead of statsmodels' multivariate KDE; a fixed bandwidth floor instead of normal-reference
bandwidths; and the model uses the largest budget that has at least `min_points` results, as BOHB does.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tessera.policy.hpo.base import Config
from tessera.policy.hpo.search_space import SearchSpace


def _log_kde(x: float, points: Sequence[float], bw: float) -> float:
    s = sum(math.exp(-0.5 * ((x - p) / bw) ** 2) for p in points) / (len(points) * bw)
    return math.log(s + 1e-300)


@dataclass
class TPESampler:
    space: SearchSpace
    gamma: float = 0.25  # fraction of observations that count as "good"
    random_fraction: float = 1 / 3  # BOHB's ρ: share of configurations drawn uniformly
    candidates: int = 24
    min_bandwidth: float = 0.05
    min_points: int | None = None  # default: dims + 2, as in BOHB
    _obs: dict[int, list[tuple[Config, float]]] = field(default_factory=lambda: defaultdict(list))

    def observe(self, config: Config, budget: int, score: float) -> None:
        self._obs[budget].append((config, score))

    def sample(self, rng: random.Random) -> dict[str, float]:
        need = self.min_points or len(self.space.dims) + 2
        ready = [b for b, obs in self._obs.items() if len(obs) >= need]
        if not ready or rng.random() < self.random_fraction:
            return self.space.sample(rng)
        obs = sorted(self._obs[max(ready)], key=lambda o: -o[1])
        n_good = max(1, math.ceil(self.gamma * len(obs)))
        good, bad = obs[:n_good], obs[n_good:] or obs[-1:]
        best: tuple[float, dict[str, float]] | None = None
        for _ in range(self.candidates):
            base = rng.choice(good)[0]
            cand: dict[str, float] = {}
            score = 0.0
            for d in self.space.dims:
                gp, bp = [c[d] for c, _ in good], [c[d] for c, _ in bad]
                bw_g = max(self.min_bandwidth, _std(gp) * len(gp) ** -0.2)
                bw_b = max(self.min_bandwidth, _std(bp) * len(bp) ** -0.2)
                cand[d] = min(1.0, max(0.0, rng.gauss(base[d], bw_g)))
                score += _log_kde(cand[d], gp, bw_g) - _log_kde(cand[d], bp, bw_b)
            if best is None or score > best[0]:
                best = (score, cand)
        assert best is not None
        return best[1]


def _std(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
