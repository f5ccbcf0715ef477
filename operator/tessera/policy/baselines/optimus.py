"""Optimus as Themis re-implemented it: one GPU at a time to the app with the largest throughput scaling
(throughput with one more GPU / throughput now), Themis §6.1."""

from __future__ import annotations

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy, best_slowdown, safe_ratio, throughput
from tessera.policy.training import AppState


class Optimus(GreedyPolicy):
    name = "optimus"
    step = "gpu"
    placement = "tight"

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        k = anchor.count
        now_thr = throughput(k, app.demand_max, app.sensitivity.slowdown(anchor.locality()))
        more = throughput(k + 1, app.demand_max, best_slowdown(app, anchor, pool, 1))
        return safe_ratio(more, now_thr)
