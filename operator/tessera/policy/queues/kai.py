"""KAI-style baseline: KAI-Scheduler's hierarchical queues — deserved quota (a queue's guarantee) and an
over-quota weight, the same division Tessera uses — with, inside a queue, jobs taken by priority and then
creation time, each admitted whole (a gang: every pod of the job, or none) where its GPUs fit, and held until
it finishes. Reclaim between queues takes GPUs back, at once, from queues above their deserved quota once the
victim ran its minimum runtime (up to the claimant's deserved quota: KAI's reclaim restores a queue's quota,
not its over-quota share); inside a queue a higher priority preempts a lower one after the same minimum
runtime.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.queues.division import QueueNode
from tessera.policy.queues.reclaim import ReclaimRule
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.training import AppState, Grant, RoundDecision


class GangByPriority:
    """Inside one queue (and one priority, as QueuedPolicy offers it): pending jobs by priority, then
    arrival; each gets its whole demand packed where it fits best, or waits while later ones that fit go
    ahead (KAI skips a job that cannot be placed). An app that lost part of its GPUs to a reclaim gets them
    back first, when they fit."""

    name = "gang-by-priority"
    lease_s = math.inf

    def allocate(
        self,
        now: float,
        apps: Sequence[AppState],
        cluster: Cluster,
        free: Sequence[str],
        rng: random.Random,
    ) -> RoundDecision:
        pool = FreePool(cluster, free)
        decision = RoundDecision()
        waiting = sorted(
            (a for a in apps if a.unmet > 0),
            key=lambda a: (not a.held, -a.priority, a.arrival, a.app_id),
        )
        for a in waiting:
            if pool.size < a.unmet:
                continue
            got = pool.take(Anchor.of(cluster, a.held), a.unmet, grow_to=a.demand_max)
            decision.grants.append(Grant(a.app_id, tuple(got), math.inf, "greedy"))
        return decision


def kai_style(queues: Sequence[QueueNode], min_runtime_s: Mapping[str, float] | None = None) -> QueuedPolicy:
    """KAI reclaims from any queue above its deserved quota, and preempts a lower priority inside a queue,
    once the victim ran its minimum runtime."""
    mins = dict(min_runtime_s or {})
    rules = {
        q.name: ReclaimRule(
            mode="immediate", min_runtime_s=mins.get(q.name, 0.0), grace_s=0.0, within_queue="LowerPriority"
        )
        for q in [*queues, QueueNode("default")]
    }
    return QueuedPolicy(GangByPriority(), queues, rules, name="kai-style")
