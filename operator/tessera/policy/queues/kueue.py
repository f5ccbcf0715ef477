"""Kueue baseline: ClusterQueues in one cohort with nominal quotas (a queue's guarantee), borrowing up to a
limit (its maximum), FIFO inside a queue, and — when configured — preemption to reclaim nominal quota.

Modelled on Kueue's scheduler (kueue.sigs.k8s.io v1beta1, v0.17). A workload is admitted whole (no partial
admission) when its queue's usage plus its request fits the queue's nominal quota, or borrowing from the
cohort's unused quota within the borrowing limit. Admission runs in cycles: each cycle takes one head per
ClusterQueue, orders the heads — those within nominal quota before those that borrow, then the oldest first
— and admits them in that order while they still fit; cycles repeat until one admits nothing. Two of
Kueue's knobs are modelled:

* `queueing_strategy`: `BestEffortFIFO` (Kueue's default) — a head that does not fit is set aside and the
  next workload of its queue may be admitted; `StrictFIFO` — the oldest pending workload blocks the queue.
* `reclaim_within_cohort`: `Never` (Kueue's default) — a queue waits for borrowers to finish; `Any` — a
  head that fits its queue's nominal quota preempts workloads of queues that borrow, the most recently
  admitted first.

No preemption within a queue (`withinClusterQueue: Never`, the default) and no priorities. Admitted
workloads keep their GPUs until they finish (no leases). A queue's `lending_limit` (Kueue's `lendingLimit`)
keeps guaranteed − lending limit of its nominal quota out of the cohort: only that queue uses it, and the
others borrow from what is left.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Literal

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.queues.division import QueueNode
from tessera.policy.queues.training import DEFAULT_QUEUE, with_default
from tessera.policy.training import AppState, Grant, RoundDecision

QueueingStrategy = Literal["BestEffortFIFO", "StrictFIFO"]
ReclaimWithinCohort = Literal["Never", "Any"]
_EPS = 1e-9


class KueueStyle:
    name = "kueue-style"
    preempts = True

    def __init__(
        self,
        queues: Sequence[QueueNode],
        queueing_strategy: QueueingStrategy = "StrictFIFO",
        reclaim_within_cohort: ReclaimWithinCohort = "Any",
    ) -> None:
        # Kueue's cohort is flat: interior queues are not modelled, every queue is a ClusterQueue.
        self.queues = {q.name: q for q in with_default(queues)}
        self.queueing_strategy = queueing_strategy
        self.reclaim_within_cohort = reclaim_within_cohort
        self.preempts = reclaim_within_cohort != "Never"

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

        def fits_nominal(a: AppState) -> bool:
            return usage[q_of(a)] + a.demand_max <= self.queues[q_of(a)].guaranteed + _EPS

        def fits_quota(a: AppState) -> bool:
            name, d = q_of(a), a.demand_max
            borrow_ok = (
                usage[name] + d <= self.queues[name].max + _EPS and from_pool(name, d) <= pool_size + _EPS
            )
            return fits_nominal(a) or borrow_ok

        pool = FreePool(cluster, free)
        decision = RoundDecision()
        admitted_at = {a.app_id: a.since for a in apps if a.held}
        pending = {
            name: sorted(
                (a for a in apps if q_of(a) == name and not a.held and a.demand_max > 0),
                key=lambda a: (a.arrival, a.app_id),
            )
            for name in self.queues
        }
        blocked: set[str] = set()  # StrictFIFO queues whose head could not be admitted this round
        while True:
            heads = [
                h
                for name in sorted(pending)
                if name not in blocked and (h := self._head(pending[name], fits_quota))
            ]
            if not heads:
                return decision
            # Kueue's cycle: heads within nominal quota before borrowers, then the oldest first.
            heads.sort(key=lambda a: (not fits_nominal(a), a.arrival, a.app_id))
            admitted = 0
            for head in heads:
                name, d = q_of(head), head.demand_max
                if not fits_quota(head):
                    continue
                if pool.size < d and fits_nominal(head) and self.reclaim_within_cohort == "Any":
                    self._preempt(apps, usage, d - pool.size, pool, decision, admitted_at, q_of)
                if pool.size < d:
                    if self.queueing_strategy == "StrictFIFO":
                        blocked.add(name)
                    else:
                        pending[name].remove(head)  # set aside until something changes (next round)
                    continue
                got = pool.take(Anchor.of(cluster, ()), d, grow_to=d)
                decision.grants.append(Grant(head.app_id, tuple(got), math.inf, "greedy"))
                usage[name] += d
                pending[name].remove(head)
                admitted += 1
            if not admitted:
                return decision

    def _head(self, pending: list[AppState], fits_quota: Callable[[AppState], bool]) -> AppState | None:
        """The workload the queue offers this cycle: its oldest (StrictFIFO), or its oldest that fits the
        queue's quota (BestEffortFIFO: the ones that do not are skipped, not blocking)."""
        if self.queueing_strategy == "StrictFIFO":
            return pending[0] if pending and fits_quota(pending[0]) else None
        return next((a for a in pending if fits_quota(a)), None)

    def _preempt(
        self,
        apps: Sequence[AppState],
        usage: dict[str, int],
        short: int,
        pool: FreePool,
        decision: RoundDecision,
        admitted_at: dict[str, float],
        q_of: Callable[[AppState], str],
    ) -> None:
        """Evict workloads of borrowing queues, most recently admitted first, until `short` GPUs are free."""
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
