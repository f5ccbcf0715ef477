"""Instantaneous fair share (DRF with GPUs as the only resource): freed GPUs go one at a time to the app
with the least current share; no preemption, so leases never expire (Themis §3.1.1, Theorem 3.1)."""

from __future__ import annotations

import math

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy
from tessera.policy.training import AppState


class Drf(GreedyPolicy):
    name = "drf"
    step = "gpu"
    placement = "any"

    def __init__(self, lease_s: float = math.inf, placement: str | None = None) -> None:
        super().__init__(lease_s, placement)

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        return -anchor.count / len(cluster)
