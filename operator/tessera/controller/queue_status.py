"""What a Queue's status says about its objects: GPUs they hold and objects waiting, by kind, and for the
waiting ones (`pending`) what each waits for and why. A parent's status is its subtree's (its own objects
and its descendants'), as its guarantee and maximum are; `own` keeps its own objects' part.

The reasons are the ones the operator can tell apart from what a round knows (the division, the reclaim
plan, the free GPUs, the App leases) and from what a TrialGroup's or ModelDeployment's own pass found.
The first that applies, in this order:

| reason | when |
|---|---|
| QueueCPUQuota, QueueMemoryQuota | a gated pod or Job whose queue has room for its GPUs, but whose CPU or memory requests would take the queue's pods past its `maxCPU` or `maxMemory` |
| QueueAtMax | the queue holds its `maxGPUs` |
| QueueModelQuota | an App whose queue's Apps hold their `maxGPUsByModel` cap of every model free now |
| NoGPUOfType | a ModelDeployment with `placement.gpuTypes` found no free GPU of those models |
| Reclaiming | GPUs are being reclaimed for the queue (from which queue, how many, by when) |
| LenderMinRuntime | the queue is owed GPUs below its guarantee, but what could be taken is within its lender's minimum runtime (until when) |
| QueueAtShare | the queue holds its whole share of this round's division |
| QueueRoom | a TrialGroup or ModelDeployment wants more at once than its queue's share has room for |
| NoFreeGPUs | its queue has room but no GPU is free (when the next App lease ends) |
| NextRound | GPUs are free and its queue has room: the next round (or the object's next pass) hands them out |

Computed once per round for every queue from lists the round builds anyway: O(objects), with the pending
list cut to the `PENDING_LIMIT` that have waited longest.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tessera.api import contract
from tessera.api.queue import PENDING_LIMIT, QueueSpec, WorkloadKind
from tessera.policy.queues.reclaim import Reclaim

_EPS = 1e-9
# status.allocatedByKind / waitingByKind keys, and the `kind` label of the queue metrics
KIND_FIELDS: dict[WorkloadKind, str] = {
    "App": "apps",
    "TrialGroup": "trialGroups",
    "ModelDeployment": "modelDeployments",
    "Job": "pods",  # a Job's pods admitted through the queue's scheduling gate
    "Pod": "pods",  # a plain pod admitted the same way
}
assert {contract.KIND_APP, contract.KIND_TRIALGROUP, contract.KIND_MODELDEPLOYMENT} < set(KIND_FIELDS)
# The `kind` label of each by-kind field in the queue metrics (Jobs' and plain pods share `Pod`).
FIELD_KINDS: dict[str, str] = {
    "apps": contract.KIND_APP,
    "trialGroups": contract.KIND_TRIALGROUP,
    "modelDeployments": contract.KIND_MODELDEPLOYMENT,
    "pods": "Pod",
}
assert set(FIELD_KINDS) == set(KIND_FIELDS.values())

# Reasons a TrialGroup's or ModelDeployment's own pass gives (the rest are the queue's).
QUEUE_ROOM = "QueueRoom"
NO_FREE_GPUS = "NoFreeGPUs"
NO_GPU_OF_TYPE = "NoGPUOfType"
QUEUE_MODEL_QUOTA = "QueueModelQuota"
QUEUE_CPU_QUOTA = "QueueCPUQuota"  # the gate's reasons (controller/quotas.py): its own pass found them
QUEUE_MEMORY_QUOTA = "QueueMemoryQuota"
WAITING_FOR_PODS = "WaitingForPods"  # a Job's group waits until all the pods it runs at once exist


@dataclass(frozen=True, slots=True)
class Workload:
    """One object of a queue as its status sees it: GPUs held and waited for as the division counts
    them (an App's leased GPUs, a pool, a deployment's replicas' GPUs)."""

    kind: WorkloadKind
    namespace: str
    name: str
    held: float
    wants: float = 0.0  # GPUs it waits for beyond those it holds (0: not waiting)
    since: float = 0.0  # when it began waiting: the longest waiting are listed first
    reason: str = ""  # what its own pass found (TrialGroups, ModelDeployments), else empty
    message: str = ""

    @property
    def waiting(self) -> bool:
        return self.wants > _EPS


@dataclass(frozen=True, slots=True)
class RoundFacts:
    """What a round knows that explains a wait."""

    now: float
    free: int = 0  # GPUs nobody holds once the round is done
    next_lease_end: float = math.inf  # the earliest App lease expiry
    next_round: float = math.inf
    reclaims: Sequence[Reclaim] = ()  # the round's reclaim plan (lease-end times known)
    blocked: Mapping[str, float] = field(default_factory=dict)  # queue → when a lender's min runtime ends
    # queue → why its Apps may take none of the free GPUs (their per-model caps: `model_quota_block`)
    model_blocked: Mapping[str, str] = field(default_factory=dict)


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at(t: float) -> str:
    return stamp(t) if math.isfinite(t) else "an unknown time"


def model_quota_block(
    queue: str, caps: Mapping[str, int], held: Mapping[str, int], free: Mapping[str, int]
) -> str:
    """Why the queue's Apps may take none of the free GPUs (`free`: model → GPUs free) when they hold
    `held` (model → GPUs) under their per-model `caps`; empty when some free GPU is within them."""
    if not any(n > 0 for n in free.values()) or any(
        n > 0 and (m not in caps or held.get(m, 0) < caps[m]) for m, n in free.items()
    ):
        return ""
    at = ", ".join(f"{m} {held.get(m, 0)} of {caps[m]}" for m in sorted(free) if free[m] > 0)
    return f"queue {queue}'s Apps hold their maxGPUsByModel of every model free now ({at})"


def why_waiting(
    w: Workload,
    queue: str,
    spec: QueueSpec,
    held: float,
    share: float,
    facts: RoundFacts,
    capped: float | None = None,
) -> tuple[str, str]:
    """(reason, message) for a waiting object of `queue`, whose own objects hold `held` GPUs of its own
    `share`; `capped` is what its maximum caps (its subtree's holding; default `held`)."""
    capped = held if capped is None else capped
    if w.reason in (QUEUE_CPU_QUOTA, QUEUE_MEMORY_QUOTA):
        return w.reason, w.message
    if spec.max_gpus is not None and capped >= spec.max_gpus - _EPS:
        return "QueueAtMax", f"queue {queue} holds {capped:g} GPUs, its maxGPUs {spec.max_gpus:g}"
    if w.kind == "App" and queue in facts.model_blocked:
        return QUEUE_MODEL_QUOTA, facts.model_blocked[queue]
    if w.reason in (NO_GPU_OF_TYPE, WAITING_FOR_PODS):
        return w.reason, w.message
    mine = [r for r in facts.reclaims if r.for_queue == queue]
    if mine:
        first = min(mine, key=lambda r: r.at)
        lenders = ", ".join(sorted({r.from_queue for r in mine}))
        n = sum(r.gpus for r in mine)
        # Below its guarantee, or borrowing within the cohort (preemption.borrowWithinCohort) above it.
        where = (
            f"below its guarantee of {spec.guaranteed_gpus:g}"
            if held < spec.guaranteed_gpus - _EPS
            else f"borrowing above its guarantee of {spec.guaranteed_gpus:g}"
        )
        return "Reclaiming", (
            f"{n:g} GPU(s) are being reclaimed for queue {queue} ({where}) from {lenders}: the first "
            f"{first.mode} at {_at(first.at)}"
        )
    if queue in facts.blocked:
        return "LenderMinRuntime", (
            f"queue {queue} is owed GPUs below its guarantee of {spec.guaranteed_gpus:g}, but the queues "
            f"above their share have held them for less than their reclaim.minRuntimeSeconds: the first may "
            f"be taken at {_at(facts.blocked[queue])}"
        )
    if held >= share - _EPS:
        return "QueueAtShare", (
            f"queue {queue} holds {held:g} GPUs, its whole share this round ({share:g}); other queues' "
            "guarantees and weights take the rest"
        )
    if w.reason:
        return w.reason, w.message
    if facts.free <= 0:
        return NO_FREE_GPUS, (
            f"queue {queue} has room ({held:g} held of a share of {share:g}) but no GPU is free; the next "
            f"App lease ends at {_at(facts.next_lease_end)}"
        )
    return "NextRound", (
        f"queue {queue} has room and {facts.free} GPU(s) are free; the next round (at "
        f"{_at(facts.next_round)}) or the object's next pass hands them out"
    )


@dataclass(frozen=True, slots=True)
class Part:
    """One queue of a subtree with its own objects and its own share (a parent's status sums its subtree's
    parts)."""

    queue: str
    spec: QueueSpec
    workloads: Sequence[Workload]
    share: float


def summary(
    queue: str,
    spec: QueueSpec,
    workloads: Iterable[Workload],
    share: float,
    facts: RoundFacts | None,
    descendants: Sequence[Part] = (),
    subtree_held: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The status fields (wire names) about the objects of the queue's subtree (`workloads` and `share` are
    its own; `descendants` the queues below it, each with its own): share, allocated, borrowed, lent and
    waiting over every kind, by kind, and the pending list, each entry with why it waits in its own queue.
    A queue with children also gets `own`: its own objects' share, GPUs and waiting count.
    `subtree_held` (queue → GPUs its subtree holds) is what each queue's maximum caps (default: own)."""
    facts = facts if facts is not None else RoundFacts(now=0.0)
    parts = [Part(queue, spec, list(workloads), share), *descendants]
    by_kind = dict.fromkeys(KIND_FIELDS.values(), 0.0)
    waiting_by_kind = dict.fromkeys(KIND_FIELDS.values(), 0)
    waiting: list[tuple[Workload, Part]] = []
    own_held: dict[str, float] = {}
    held = demand = 0.0
    for part in parts:
        own_held[part.queue] = 0.0
        for w in part.workloads:
            key = KIND_FIELDS[w.kind]
            by_kind[key] += w.held
            own_held[part.queue] += w.held
            demand += w.held + w.wants
            if w.waiting:
                waiting_by_kind[key] += 1
                waiting.append((w, part))
        held += own_held[part.queue]
    oldest = heapq.nsmallest(
        PENDING_LIMIT, waiting, key=lambda wp: (wp[0].since, wp[0].kind, wp[0].namespace, wp[0].name)
    )
    pending = []
    for w, part in oldest:
        capped = own_held[part.queue] if subtree_held is None else subtree_held.get(part.queue, 0.0)
        reason, message = why_waiting(
            w, part.queue, part.spec, own_held[part.queue], part.share, facts, capped=capped
        )
        pending.append(
            {
                "kind": w.kind,
                "namespace": w.namespace,
                "name": w.name,
                "queue": part.queue,
                "gpus": w.wants,
                "since": stamp(w.since),
                "reason": reason,
                "message": message,
            }
        )
    lend_cap = math.inf if spec.lending_limit_gpus is None else spec.lending_limit_gpus
    out: dict[str, Any] = {
        "shareGPUs": sum(p.share for p in parts),
        "allocatedGPUs": held,
        "allocatedByKind": by_kind,
        "borrowedGPUs": max(0.0, held - spec.guaranteed_gpus),
        "lentGPUs": min(max(0.0, spec.guaranteed_gpus - max(held, demand)), lend_cap),
        "waiting": len(waiting),
        "waitingByKind": waiting_by_kind,
        "pending": pending,
    }
    if descendants:
        out["own"] = {
            "shareGPUs": share,
            "allocatedGPUs": own_held[queue],
            "waiting": sum(1 for _, p in waiting if p.queue == queue),
        }
    return out
