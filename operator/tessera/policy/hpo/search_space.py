"""A unit-cube search space: random samples, grids, and PBT perturbations, all seeded."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from tessera.policy.hpo.base import Config


@dataclass(frozen=True, slots=True)
class SearchSpace:
    dims: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.dims or len(set(self.dims)) != len(self.dims):
            raise ValueError("a search space needs at least one dimension and unique names")

    def sample(self, rng: random.Random) -> dict[str, float]:
        return {d: rng.random() for d in self.dims}

    def grid(self, points_per_dim: int) -> list[dict[str, float]]:
        if points_per_dim < 1:
            raise ValueError("points_per_dim must be >= 1")
        ticks = [(k + 0.5) / points_per_dim for k in range(points_per_dim)]
        return [dict(zip(self.dims, p, strict=True)) for p in itertools.product(ticks, repeat=len(self.dims))]

    def perturb(self, config: Config, rng: random.Random, resample_p: float = 0.25) -> dict[str, float]:
        """PBT explore: resample a dimension with probability p, else scale it by 0.8 or 1.2 (Ray Tune's)."""
        out = {}
        for d in self.dims:
            if rng.random() < resample_p:
                out[d] = rng.random()
            else:
                out[d] = min(1.0, max(0.0, config[d] * rng.choice((0.8, 1.2))))
        return out
