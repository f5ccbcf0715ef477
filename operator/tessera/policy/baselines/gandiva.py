"""Gandiva as Themis re-implemented it: every app reports its placement preference and GPUs go
"greedy highest preference first", maximising the average placement score 1/S (Themis §6.1)."""

from __future__ import annotations

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy, best_slowdown
from tessera.policy.training import AppState


class Gandiva(GreedyPolicy):
    name = "gandiva"
    step = "gang"
    placement = "tight"

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        return 1.0 / best_slowdown(app, anchor, pool, app.unmet - given)
