"""Tiresias (2D-LAS) as Themis re-implemented it: least attained GPU service first, placement-unaware
(Themis §6.1)."""

from __future__ import annotations

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy
from tessera.policy.training import AppState


class Tiresias(GreedyPolicy):
    name = "tiresias"
    step = "gang"
    placement = "any"

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        return -app.attained_service
