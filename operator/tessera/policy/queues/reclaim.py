"""Reclaim: a queue below its guarantee with waiting work takes GPUs back from queues above theirs.

Rules (one place, for the operator's events and the simulator alike):

* only what free GPUs cannot cover is reclaimed, and only up to min(guarantee, entitled share, demand);
* a lender is never taken below its own guarantee, nor below its entitled share;
* nothing held for less than the lender's minimum runtime is taken (counted from when the holding began);
* nothing a non-preemptible object holds is taken;
* the claimant's `reclaim_within_cohort` says what of an `immediate` lender it may take before the lease
  ends: `Any` holding, only those of `LowerPriority` than its highest-priority waiting object, or `Never`
  (it waits for leases to end; lease-end returns are the division's and need no permission);
* `atLeaseEnd` (default): the GPUs come back when the holder's lease ends (they are not renewed);
  `immediate`: they are taken now, after the checkpoint grace;
* the lowest-priority, then newest holdings of the queue furthest above its share go first (the least
  work lost).

Borrowing within the cohort (Kueue's `borrowWithinCohort`): above its guarantee a queue gets the rest of its
share as leases end (the division's). With `borrow_within_cohort` `LowerPriority` it may take it at once
instead, after the guarantees above are served: up to min(share, demand), only holdings of `immediate`
lenders above their own share (borrowing: above their guarantee too), of lower priority than its
highest-priority waiting object and, with `borrow_max_priority`, of priority at most that; the same minimum
runtime, grace and order apply. `Never` (default): it waits for leases to end, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tessera.policy.queues.division import QueueNode, headroom

ReclaimMode = Literal["atLeaseEnd", "immediate"]
ReclaimWithinCohort = Literal["Any", "LowerPriority", "Never"]
WithinQueue = Literal["Never", "LowerPriority"]
BorrowWithinCohort = Literal["Never", "LowerPriority"]
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ReclaimRule:
    mode: ReclaimMode = "atLeaseEnd"
    min_runtime_s: float = 0.0
    grace_s: float = 30.0  # the checkpoint grace an `immediate` reclaim waits
    # As a claimant: which holdings of other queues it may take before their leases end (Kueue's
    # reclaimWithinCohort; Any is what reclaim always did).
    reclaim_within_cohort: ReclaimWithinCohort = "Any"
    # Inside the queue: may a higher-priority App take GPUs of lower-priority Apps of the same queue before
    # their leases end (Kueue's withinClusterQueue)? Never: it gets them as their leases end.
    within_queue: WithinQueue = "Never"
    # As a claimant above its guarantee: may it take the rest of its share at once from lower-priority
    # holdings of `immediate` lenders above theirs (Kueue's borrowWithinCohort)? Never: as leases end.
    borrow_within_cohort: BorrowWithinCohort = "Never"
    borrow_max_priority: int | None = None  # with LowerPriority: only holdings of at most this priority


@dataclass(frozen=True, slots=True)
class Holding:
    """GPUs one object (an App, a TrialGroup, a ModelDeployment's replicas) holds in a queue."""

    queue: str
    owner: str
    gpus: float
    since: float  # when the holding began (the minimum runtime counts from here)
    lease_end: float  # when its lease ends (math.inf: held until done)
    priority: int = 0
    preemptible: bool = True  # False: never taken


@dataclass(frozen=True, slots=True)
class Reclaim:
    """`gpus` of `owner` (in `from_queue`) go to `for_queue` at time `at`."""

    owner: str
    from_queue: str
    for_queue: str
    gpus: float
    at: float
    mode: ReclaimMode
    reason: str
    grace_s: float = 0.0  # the lending queue's checkpoint grace (what an `immediate` reclaim waits)


def plan_reclaim(
    now: float,
    queues: Sequence[QueueNode],
    rules: Mapping[str, ReclaimRule],
    shares: Mapping[str, float],
    holdings: Sequence[Holding],
    waiting: Mapping[str, float],
    free: float,
    waiting_priority: Mapping[str, int] | None = None,
    blocked: dict[str, float] | None = None,
) -> list[Reclaim]:
    """What to take back, from whom, for whom and when. `shares` are the queues' entitled GPUs (own
    shares), `waiting` the GPUs each queue's objects wait for, `free` the GPUs nobody holds,
    `waiting_priority` the highest priority among each queue's waiting objects (0 when absent). `blocked`,
    if given, receives each queue still owed GPUs after the plan only because holdings were within their
    lender's minimum runtime, with when the first of them may be taken (what a Queue's status reports)."""
    top = dict(waiting_priority or {})
    node = {q.name: q for q in queues}
    held: dict[str, float] = {}
    for h in holdings:
        held[h.queue] = held.get(h.queue, 0.0) + h.gpus
    need: dict[str, float] = {}  # owed below the guarantee
    borrow: dict[str, float] = {}  # the rest of the share a queue may take at once (borrow_within_cohort)
    for q in queues:
        have = held.get(q.name, 0.0)
        want = have + waiting.get(q.name, 0.0)
        target = min(q.guaranteed, shares.get(q.name, 0.0), want)
        if target - have > _EPS:
            need[q.name] = target - have
        if rules.get(q.name, ReclaimRule()).borrow_within_cohort == "LowerPriority":
            more = min(shares.get(q.name, 0.0), want) - max(have, target)
            if more > _EPS:
                borrow[q.name] = more
    # Free GPUs go to the neediest first, then to borrowers; reclaim covers only the rest. Neither takes a
    # claimant's ancestor past its maximum (`headroom`): free GPUs a full parent leaves idle cover no need,
    # and GPUs help only when they come from inside every full ancestor. `now_held` follows the plan.
    now_held = dict(held)
    for owed in (need, borrow):
        for name in sorted(owed, key=lambda n: -owed[n]):
            use = max(0.0, min(free, owed[name], headroom(queues, now_held)[name]))
            free -= use
            owed[name] -= use
            now_held[name] = now_held.get(name, 0.0) + use
    need = {k: v for k, v in need.items() if v > _EPS}
    borrow = {k: v for k, v in borrow.items() if v > _EPS}
    if not need and not borrow:
        return []
    lendable = {
        name: have - max(node[name].guaranteed, shares.get(name, 0.0))
        for name, have in held.items()
        if name in node and have - max(node[name].guaranteed, shares.get(name, 0.0)) > _EPS
    }
    out: list[Reclaim] = []
    victims = sorted(
        (h for h in holdings if h.queue in lendable and h.preemptible),
        key=lambda h: (-lendable[h.queue], h.priority, -h.since, h.owner),
    )
    for claimant in sorted(need, key=lambda n: (-need[n], n)):
        young = math.inf  # when the first holding skipped for its minimum runtime may be taken
        for h in victims:
            rule = rules.get(h.queue, ReclaimRule())
            if need[claimant] <= _EPS:
                break
            if now - h.since < rule.min_runtime_s - _EPS:
                if lendable[h.queue] > _EPS:
                    young = min(young, h.since + rule.min_runtime_s)
                continue
            if rule.mode == "immediate" and not _may_take(
                rules.get(claimant, ReclaimRule()), h, top, claimant
            ):
                continue
            reason = (
                f"queue {claimant} is below its guarantee of {node[claimant].guaranteed:g} GPUs with work "
                f"waiting; {h.queue} holds {held[h.queue]:g}, above its share"
            )
            need[claimant] -= _take(
                now, queues, h, rule, claimant, need[claimant], lendable, now_held, out, reason
            )
        if blocked is not None and need[claimant] > _EPS and math.isfinite(young):
            blocked[claimant] = young
    for claimant in sorted(borrow, key=lambda n: (-top.get(n, 0), -borrow[n], n)):
        crule = rules.get(claimant, ReclaimRule())
        for h in victims:
            rule = rules.get(h.queue, ReclaimRule())
            if borrow[claimant] <= _EPS:
                break
            if (
                h.queue == claimant
                or rule.mode != "immediate"
                or now - h.since < rule.min_runtime_s - _EPS
                or h.priority >= top.get(claimant, 0)
                or (crule.borrow_max_priority is not None and h.priority > crule.borrow_max_priority)
            ):
                continue
            reason = (
                f"queue {claimant} borrows within its share of {shares.get(claimant, 0.0):g} GPUs for work of "
                f"priority {top.get(claimant, 0)} (preemption.borrowWithinCohort LowerPriority); {h.queue} "
                f"holds {held[h.queue]:g}, above its share, at priority {h.priority}"
            )
            borrow[claimant] -= _take(
                now, queues, h, rule, claimant, borrow[claimant], lendable, now_held, out, reason
            )
    return out


def _take(
    now: float,
    queues: Sequence[QueueNode],
    h: Holding,
    rule: ReclaimRule,
    claimant: str,
    owed: float,
    lendable: dict[str, float],
    now_held: dict[str, float],
    out: list[Reclaim],
    reason: str,
) -> float:
    """Plan taking what `claimant` is `owed` of holding `h` (within its lender's `lendable` and the
    claimant's ancestors' maxima); returns the GPUs planned."""
    taken = sum(r.gpus for r in out if r.owner == h.owner)
    room = headroom(queues, now_held, moving_from=h.queue)[claimant]
    take = min(h.gpus - taken, lendable[h.queue], owed, room)
    if take <= _EPS:
        return 0.0
    now_held[claimant] = now_held.get(claimant, 0.0) + take
    now_held[h.queue] -= take
    at = now + rule.grace_s if rule.mode == "immediate" else max(now, h.lease_end)
    out.append(Reclaim(h.owner, h.queue, claimant, take, at, rule.mode, reason, rule.grace_s))
    lendable[h.queue] -= take
    return take


def _may_take(claimant_rule: ReclaimRule, h: Holding, top: Mapping[str, int], claimant: str) -> bool:
    """Whether the claimant's `reclaim_within_cohort` lets it take `h` before its lease ends."""
    policy = claimant_rule.reclaim_within_cohort
    if policy == "Never":
        return False
    return policy == "Any" or h.priority < top.get(claimant, 0)
