"""Seeded tuning workloads: per-config iteration times and learning curves, packing α and scaling β.

The seed gives no curves or budgets (spec Part 5), so these are ours: a config in the unit cube has a
final score a(x) = best − quality_spread · mean((x − x*)²)·4 and a curve a(x)·(1 − e^{−t/τ(x)}) with small
seeded per-report noise; its iteration time on one GPU is iter_time · e^{time_spread·(x_0 − ½)}.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass

from tessera.policy.fluid import RuntimeModel
from tessera.policy.hpo import Config, SearchSpace, TrialRun


@dataclass(frozen=True, slots=True)
class TuningWorkload:
    name: str = "cifar10-like"
    dims: int = 3
    iter_time: float = 10.0  # seconds per iteration on one GPU at x_0 = ½
    time_spread: float = 1.0  # log-spread of iteration time across configs (runtime variance)
    alpha: float = 1.15  # packing slowdown per extra neighbour (Eq. 3.2)
    beta: float = 1.05  # scaling overhead (Eq. 3.2)
    gpu_util: float = 0.6  # share of a GPU one trial keeps busy alone (Fig. 3.2: "at most 60%")
    best: float = 0.95
    quality_spread: float = 0.4
    tau: float = 8.0  # curve time constant in iterations
    noise: float = 0.003
    target: float = 0.85
    seed: int = 0

    def __post_init__(self) -> None:
        if self.iter_time <= 0 or self.tau <= 0 or self.dims < 1:
            raise ValueError("iter_time, tau must be > 0 and dims >= 1")
        RuntimeModel(self.alpha, self.beta)  # range check

    @property
    def space(self) -> SearchSpace:
        return SearchSpace(tuple(f"x{i}" for i in range(self.dims)))

    def _optimum(self) -> list[float]:
        rng = random.Random(self.seed)
        return [0.2 + 0.6 * rng.random() for _ in range(self.dims)]

    def final_score(self, config: Config) -> float:
        opt = self._optimum()
        dist = sum((config[f"x{i}"] - o) ** 2 for i, o in enumerate(opt)) / self.dims
        return self.best - self.quality_spread * 4.0 * dist

    def iteration_time(self, spec: TrialRun) -> float:
        return self.iter_time * math.exp(self.time_spread * (spec.config["x0"] - 0.5))

    def runtime_model(self, spec: TrialRun) -> RuntimeModel:
        return RuntimeModel(self.alpha, self.beta)

    def score(self, spec: TrialRun, iteration: int) -> float:
        tau = self.tau * (0.5 + spec.config[f"x{self.dims - 1}"])
        key = zlib.crc32(
            f"{self.seed}/{spec.trial_id}/{iteration}".encode()
        )  # str hash() is salted per process
        noise = random.Random(key).gauss(0.0, self.noise)
        return self.final_score(spec.config) * (1.0 - math.exp(-iteration / tau)) + noise
