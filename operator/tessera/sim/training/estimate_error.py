"""Estimation error for the error analysis of Themis' Fig. 17 (§6.3).

Each app's AGENT gets a fixed error drawn uniformly from [−X, X] on its iteration counts and another on its
placement slowdown S. Its answers (remaining time for a bid, total and remaining work) are scaled by them;
the simulated jobs still run at their true speed, so only the policy's view is wrong.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tessera.policy.training import Estimator


@dataclass(frozen=True, slots=True)
class AppError:
    iterations: float  # e_it ∈ [−X, X]: the app believes it has (1 + e_it) × its true iterations left
    slowdown: float  # e_S ∈ [−X, X]: it believes every placement runs at S × (1 + e_S)

    @staticmethod
    def draw(app_id: str, bound: float, seed: int = 0) -> AppError:
        """Deterministic per app and seed, and independent of the policy's random stream."""
        rng = random.Random(f"estimate-error:{seed}:{app_id}")
        return AppError(rng.uniform(-bound, bound), rng.uniform(-bound, bound))

    @property
    def work_factor(self) -> float:
        return 1.0 + self.iterations


@dataclass(frozen=True, slots=True)
class MisestimatingEstimator:
    """An app's true estimator seen through its error (satisfies `Estimator`)."""

    inner: Estimator
    error: AppError

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return (
            self.inner.remaining_time(gpus, slowdown * (1.0 + self.error.slowdown)) * self.error.work_factor
        )
