"""SLAQ as Themis re-implemented it: apps report the loss decrease the offered GPU would buy over one
lease; "greedy highest loss first" (Themis §6.1).

Tessera's choice: loss follows the usual O(1/√iterations) SGD curve in the app's progress p ∈ [0, 1]:
loss(p) = 1/√(1 + 100·p); an extra GPU for one lease advances p by lease·(k+1)/S / total_work.
"""

from __future__ import annotations

import math

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy, best_slowdown, throughput
from tessera.policy.training import AppState


def loss(progress: float) -> float:
    return 1.0 / math.sqrt(1.0 + 100.0 * min(1.0, max(0.0, progress)))


class Slaq(GreedyPolicy):
    name = "slaq"
    step = "gpu"
    placement = "any"

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        if app.total_work <= 0:
            return 0.0
        k = anchor.count
        s = best_slowdown(app, anchor, pool, 1)
        dp_now = self.lease_s * throughput(k, app.demand_max, s) / app.total_work
        dp_more = self.lease_s * throughput(k + 1, app.demand_max, s) / app.total_work
        p = app.progress
        return (loss(p + dp_now) - loss(p + dp_more)) if math.isfinite(self.lease_s) else loss(p)
