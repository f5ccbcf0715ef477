"""Kueue-style baseline: ClusterQueues in one cohort with nominal quotas (a queue's guarantee), borrowing up
to a limit (its maximum), strict FIFO inside a queue, and preemption to reclaim nominal quota.

Modelled on Kueue's defaults (kueue.sigs.k8s.io, v1beta1): a workload is admitted whole (no partial
admission) when its queue's usage plus its request fits the queue's nominal quota, or borrowing from the
cohort's unused quota within the borrowing limit; `queueingStrategy: StrictFIFO` (the oldest pending workload
of a queue blocks the ones behind it); `reclaimWithinCohort: Any` (a queue that stays within its nominal quota
preempts workloads of queues borrowing, the most recently admitted first); no preemption within a queue.
Admitted workloads keep their GPUs until they finish (no leases). A queue's `lending_limit` (Kueue's
`lendingLimit`) keeps guaranteed − lending limit of its nominal quota out of the cohort: only that queue
uses it, and the others borrow from what is left.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.queues.division import QueueNode
from tessera.policy.queues.training import DEFAULT_QUEUE, with_default
from tessera.policy.training import AppState, Grant, RoundDecision


class KueueStyle:
    name = "kueue-style"
    preempts = True

    def __init__(self, queues: Sequence[QueueNode]) -> None:
        # Kueue's cohort is flat: interior queues are not modelled, every queue is a ClusterQueue.
        self.queues = {q.name: q for q in with_default(queues)}

    @property
    def lease_s(self) -> float:
        return math.inf

    def allocate(
        self,
        now: float,
        apps: Sequence[AppState],
        cluster: Cluster,
        free: Sequence[str],
        rng: random.Random,
    ) -> RoundDecision:
        def q_of(a: AppState) -> str:
            return a.queue if a.queue in self.queues else DEFAULT_QUEUE

        usage = dict.fromkeys(self.queues, 0)
        for a in apps:
            usage[q_of(a)] += len(a.held)
        nominal_total = sum(q.guaranteed for q in self.queues.values())
        reserve = {n: q.reserve for n, q in self.queues.items()}
        # The cohort's pool: what no queue's lending limit keeps for itself. Usage within a queue's own
        # reserve is drawn from the reserve, the rest from the pool.
        pool_size = max(nominal_total, len(cluster)) - sum(reserve.values())

        def from_pool(name: str, extra: int) -> float:
            return sum(max(0.0, usage[n] + (extra if n == name else 0) - reserve[n]) for n in usage)

        pool = FreePool(cluster, free)
        decision = RoundDecision()
        admitted_at = {a.app_id: a.since for a in apps if a.held}
        for name in sorted(self.queues):
            q = self.queues[name]
            pending = sorted(
                (a for a in apps if q_of(a) == name and not a.held), key=lambda a: (a.arrival, a.app_id)
            )
            for head in pending:  # StrictFIFO: stop at the first workload that cannot be admitted
                d = head.demand_max
                if d <= 0:
                    continue
                within_nominal = usage[name] + d <= q.guaranteed
                borrow_ok = usage[name] + d <= q.max and from_pool(name, d) <= pool_size + 1e-9
                if not (within_nominal or borrow_ok):
                    break
                if pool.size < d and within_nominal:
                    self._preempt(apps, usage, d - pool.size, pool, decision, admitted_at, q_of, cluster)
                if pool.size < d:
                    break
                got = pool.take(Anchor.of(cluster, ()), d, grow_to=d)
                decision.grants.append(Grant(head.app_id, tuple(got), math.inf, "greedy"))
                usage[name] += d
        return decision

    def _preempt(
        self,
        apps: Sequence[AppState],
        usage: dict[str, int],
        short: int,
        pool: FreePool,
        decision: RoundDecision,
        admitted_at: dict[str, float],
        q_of: object,
        cluster: Cluster,
    ) -> None:
        """Evict workloads of borrowing queues, most recently admitted first, until `short` GPUs are free."""
        assert callable(q_of)
        victims = sorted(
            (a for a in apps if a.held and a.app_id not in decision.revoke),
            key=lambda a: (-admitted_at[a.app_id], a.app_id),
        )
        for v in victims:
            if short <= 0:
                return
            vq = q_of(v)
            if usage[vq] - len(v.held) < 0 or usage[vq] <= self.queues[vq].guaranteed:
                continue
            decision.revoke[v.app_id] = tuple(sorted(v.held))
            pool.put(v.held)
            usage[vq] -= len(v.held)
            short -= len(v.held)
