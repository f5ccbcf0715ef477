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
    need: dict[str, float] = {}
    for q in queues:
        have = held.get(q.name, 0.0)
        target = min(q.guaranteed, shares.get(q.name, 0.0), have + waiting.get(q.name, 0.0))
        if target - have > _EPS:
            need[q.name] = target - have
    # Free GPUs go to the neediest first; reclaim covers only the rest. Neither takes a claimant's
    # ancestor past its maximum (`headroom`): free GPUs a full parent leaves idle cover no need, and GPUs
    # help only when they come from inside every full ancestor. `now_held` follows the plan.
    now_held = dict(held)
    for name in sorted(need, key=lambda n: -need[n]):
        use = max(0.0, min(free, need[name], headroom(queues, now_held)[name]))
        free -= use
        need[name] -= use
        now_held[name] = now_held.get(name, 0.0) + use
    need = {k: v for k, v in need.items() if v > _EPS}
    if not need:
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
            taken = sum(r.gpus for r in out if r.owner == h.owner)
            room = headroom(queues, now_held, moving_from=h.queue)[claimant]
            take = min(h.gpus - taken, lendable[h.queue], need[claimant], room)
            if take <= _EPS:
                continue
            now_held[claimant] = now_held.get(claimant, 0.0) + take
            now_held[h.queue] -= take
            at = now + rule.grace_s if rule.mode == "immediate" else max(now, h.lease_end)
            reason = (
                f"queue {claimant} is below its guarantee of {node[claimant].guaranteed:g} GPUs with work "
                f"waiting; {h.queue} holds {held[h.queue]:g}, above its share"
            )
            out.append(Reclaim(h.owner, h.queue, claimant, take, at, rule.mode, reason, rule.grace_s))
            lendable[h.queue] -= take
            need[claimant] -= take
        if blocked is not None and need[claimant] > _EPS and math.isfinite(young):
            blocked[claimant] = young
    return out


def _may_take(claimant_rule: ReclaimRule, h: Holding, top: Mapping[str, int], claimant: str) -> bool:
    """Whether the claimant's `reclaim_within_cohort` lets it take `h` before its lease ends."""
    policy = claimant_rule.reclaim_within_cohort
    if policy == "Never":
        return False
    return policy == "Any" or h.priority < top.get(claimant, 0)
