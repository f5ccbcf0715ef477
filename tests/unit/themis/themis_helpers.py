"""Small hand-built apps for the Themis unit tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.cluster import Sensitivity
from tessera.policy.training import AppState

FLAT = Sensitivity(1.0, 1.0, 1.0, 1.0)


@dataclass
class OneJob:
    """Eq. 1: remaining = work × S / min(k, demand)."""

    work: float
    demand: int

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return math.inf if gpus <= 0 else self.work * slowdown / min(gpus, self.demand)


def app(
    app_id: str,
    work: float,
    demand: int,
    *,
    held: tuple[str, ...] = (),
    sens: Sensitivity = FLAT,
    arrival: float = 0.0,
    n_avg: float = 1.0,
    remaining: float | None = None,
) -> AppState:
    rem = work if remaining is None else remaining
    return AppState(
        app_id=app_id,
        arrival=arrival,
        demand_max=demand,
        held=frozenset(held),
        sensitivity=sens,
        total_work=work,
        remaining_work=rem,
        attained_service=work - rem,
        n_avg=n_avg,
        estimator=OneJob(rem, demand),
    )
