"""SRSF: one GPU at a time to the app with the shortest remaining service (GPU × time), which is known
exactly; it approximates Tiresias' Gittins-index policy (Themis §6.1)."""

from __future__ import annotations

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy
from tessera.policy.training import AppState


class Srsf(GreedyPolicy):
    name = "srsf"
    step = "gpu"
    placement = "any"

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        return -app.remaining_work
