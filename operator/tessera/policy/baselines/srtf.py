"""SRTF: shortest remaining time (with the offered GPUs, best placement) first; better packing means a
shorter remaining time (Themis §6.1)."""

from __future__ import annotations

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.baselines.greedy import GreedyPolicy, best_slowdown
from tessera.policy.training import AppState


class Srtf(GreedyPolicy):
    name = "srtf"
    step = "gang"
    placement = "tight"

    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        want = app.unmet - given
        s = best_slowdown(app, anchor, pool, want)
        return -app.estimator.remaining_time(anchor.count + min(want, pool.size), s)
