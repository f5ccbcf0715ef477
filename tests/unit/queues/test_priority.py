"""Priority inside a queue, the per-queue preemption policy, non-preemptible Apps and the minimum runtime
counted from the start of a holding: hand-worked rounds on 8 GPUs (two machines of 4)."""

from __future__ import annotations

import dataclasses
import math
import random

from tessera.cluster import Cluster
from tessera.policy.queues import Holding, QueueNode, ReclaimRule, plan_reclaim
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis
from tessera.policy.training import AppState, RoundDecision, check_decision

from tests.unit.queues.test_queue_policies import app

CLUSTER = Cluster.homogeneous(2, 4)  # m000/0..3, m001/0..3
M0 = tuple(f"m000/{i}" for i in range(4))
M1 = tuple(f"m001/{i}" for i in range(4))
NOW = 1000.0


def ranked(a: AppState, priority: int = 0, preemptible: bool = True) -> AppState:
    return dataclasses.replace(a, priority=priority, preemptible=preemptible)


def granted(d: RoundDecision) -> dict[str, int]:
    return {k: len(v) for k, v in d.granted().items()}


def allocate(policy: QueuedPolicy, apps: list[AppState], free: list[str]) -> RoundDecision:
    d = policy.allocate(NOW, apps, CLUSTER, free, random.Random(0))
    check_decision(d, apps, free)
    return d


# --- priority inside a queue -------------------------------------------------------------------------


def test_the_queue_share_goes_to_the_highest_priority_first() -> None:
    # Queue a is guaranteed 4 of 8 and capped at 4; three Apps of a want 4 each. Without priorities Themis
    # splits the 4; with them, the priority-10 App takes all 4, the others nothing.
    qs = [QueueNode("a", guaranteed=4, max=4)]
    apps = [app("low1", "a", 4), ranked(app("high", "a", 4), 10), app("low2", "a", 4)]
    d = allocate(QueuedPolicy(Themis(), qs), apps, list(CLUSTER.gpu_ids))
    assert granted(d) == {"high": 4}


def test_lower_priorities_get_what_the_higher_one_cannot_use() -> None:
    # The priority-10 App wants 1 of the queue's 4: the three others share the rest.
    qs = [QueueNode("a", guaranteed=4, max=4)]
    apps = [ranked(app("high", "a", 1), 10), app("low1", "a", 4), ranked(app("mid", "a", 2), 5)]
    d = allocate(QueuedPolicy(Themis(), qs), apps, list(CLUSTER.gpu_ids))
    assert granted(d) == {"high": 1, "mid": 2, "low1": 1}


def test_in_a_full_queue_a_new_high_priority_app_gets_the_gpus_of_the_next_lease_to_end() -> None:
    # low holds m000 (its lease goes on), low2's lease on m001 just ended: the 4 GPUs it held go to the
    # high-priority App, not back to low2 (withinQueue Never: nothing is taken before its lease ends).
    qs = [QueueNode("a", guaranteed=8, max=8)]
    apps = [
        app("low", "a", 4, held=M0),
        dataclasses.replace(app("low2", "a", 4), previous=frozenset(M1)),
        ranked(app("high", "a", 4), 10),
    ]
    d = allocate(QueuedPolicy(Themis(), qs), apps, list(M1))
    assert granted(d) == {"high": 4}
    assert d.revoke == {}


def test_without_priorities_a_round_is_what_it_was() -> None:
    # The same round twice, all priorities 0 and all 7: one tier either way, the same grants.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    apps = [app("a1", "a", 3), app("a2", "a", 4, held=M0[:1]), app("b1", "b", 8)]
    free = [g for g in CLUSTER.gpu_ids if g != M0[0]]
    d0 = allocate(QueuedPolicy(Themis(), qs), apps, free)
    d7 = allocate(QueuedPolicy(Themis(), qs), [ranked(a, 7) for a in apps], free)
    assert d0.granted() == d7.granted()


# --- within the queue: preemption.withinQueue LowerPriority --------------------------------------------


def test_within_queue_lower_priority_takes_gpus_from_lower_priority_apps_at_once() -> None:
    # Queue a (g 8) is full: low holds all 8 since t=0. high (priority 10) arrives wanting 4: with
    # withinQueue LowerPriority, 4 of low's GPUs are revoked and granted to high in the same round.
    qs = [QueueNode("a", guaranteed=8)]
    rules = {"a": ReclaimRule(within_queue="LowerPriority")}
    apps = [app("low", "a", 8, held=M0 + M1), ranked(app("high", "a", 4), 10)]
    d = allocate(QueuedPolicy(Themis(), qs, rules), apps, [])
    assert {k: len(v) for k, v in d.revoke.items()} == {"low": 4}
    assert granted(d) == {"high": 4}
    assert d.record["within_queue"] == ["low"]


def test_within_queue_never_and_equal_priorities_take_nothing() -> None:
    qs = [QueueNode("a", guaranteed=8)]
    full = [app("low", "a", 8, held=M0 + M1)]
    never = allocate(QueuedPolicy(Themis(), qs), [*full, ranked(app("high", "a", 4), 10)], [])
    assert never.revoke == {} and granted(never) == {}
    rules = {"a": ReclaimRule(within_queue="LowerPriority")}
    equal = allocate(QueuedPolicy(Themis(), qs, rules), [*full, app("peer", "a", 4)], [])
    assert equal.revoke == {} and granted(equal) == {}


def test_within_queue_spares_non_preemptible_and_young_holdings() -> None:
    qs = [QueueNode("a", guaranteed=8)]
    rules = {"a": ReclaimRule(within_queue="LowerPriority", min_runtime_s=600)}
    high = ranked(app("high", "a", 4), 10)
    pinned = ranked(app("low", "a", 8, held=M0 + M1), preemptible=False)
    assert allocate(QueuedPolicy(Themis(), qs, rules), [pinned, high], []).revoke == {}
    young = app("low", "a", 8, held=M0 + M1, since=NOW - 599)
    assert allocate(QueuedPolicy(Themis(), qs, rules), [young, high], []).revoke == {}
    old = app("low", "a", 8, held=M0 + M1, since=NOW - 600)
    assert {
        k: len(v) for k, v in allocate(QueuedPolicy(Themis(), qs, rules), [old, high], []).revoke.items()
    } == {"low": 4}


# --- non-preemptible ------------------------------------------------------------------------------------


def test_a_non_preemptible_app_gets_back_the_gpus_whose_lease_ended() -> None:
    # Both leases ended this round. The priority-10 App would take the whole queue's 4, but the
    # non-preemptible App keeps its 2: the GPUs it held come back to it first.
    qs = [QueueNode("a", guaranteed=4, max=4)]
    pinned = ranked(dataclasses.replace(app("pinned", "a", 2), previous=frozenset(M0[:2])), preemptible=False)
    high = ranked(app("high", "a", 4), 10)
    d = allocate(QueuedPolicy(Themis(), qs), [pinned, high], list(CLUSTER.gpu_ids))
    assert sorted(d.granted()["pinned"]) == list(M0[:2])
    assert granted(d) == {"pinned": 2, "high": 2}


def test_immediate_reclaim_never_takes_a_non_preemptible_holding() -> None:
    # B borrowed all 8 under `immediate`; A (g 4) waits. Only the preemptible App of B gives back.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=0)]
    rules = {"b": ReclaimRule(mode="immediate")}
    apps = [
        ranked(app("b-pinned", "b", 4, held=M0), preemptible=False),
        app("b-free", "b", 4, held=M1),
        app("a1", "a", 4),
    ]
    d = allocate(QueuedPolicy(Themis(), qs, rules), apps, [])
    assert {k: len(v) for k, v in d.revoke.items()} == {"b-free": 4}
    only_pinned = [apps[0], app("a1", "a", 4)]
    assert allocate(QueuedPolicy(Themis(), qs, rules), only_pinned, []).revoke == {}


# --- reclaimWithinCohort ----------------------------------------------------------------------------


A = QueueNode("a", guaranteed=4)
B = QueueNode("b", guaranteed=0)
IMMEDIATE = ReclaimRule(mode="immediate", grace_s=0)


def _plan(claimant: ReclaimRule, holdings: list[Holding], top: int) -> list[tuple[str, float]]:
    rules = {"a": claimant, "b": IMMEDIATE}
    plan = plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 0}, holdings, {"a": 4}, 0, {"a": top})
    return [(r.owner, r.gpus) for r in plan]


def test_reclaim_within_cohort_lower_priority_refuses_equal_and_higher_priority_holdings() -> None:
    held = [
        Holding("b", "b-high", 2, since=0, lease_end=math.inf, priority=10),
        Holding("b", "b-equal", 2, since=0, lease_end=math.inf, priority=5),
        Holding("b", "b-low", 2, since=0, lease_end=math.inf, priority=1),
    ]
    lower = ReclaimRule(reclaim_within_cohort="LowerPriority")
    assert _plan(lower, held, top=5) == [("b-low", 2)]
    assert _plan(ReclaimRule(reclaim_within_cohort="Any"), held, top=5) == [("b-low", 2), ("b-equal", 2)]
    assert _plan(ReclaimRule(reclaim_within_cohort="Never"), held, top=5) == []


def test_reclaim_within_cohort_does_not_hold_back_lease_end_returns() -> None:
    # B lends under atLeaseEnd: its GPUs return when the lease ends whatever A's policy says.
    held = [Holding("b", "x", 8, since=0, lease_end=NOW + 60, priority=10)]
    rules = {"a": ReclaimRule(reclaim_within_cohort="Never")}
    plan = plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, held, {"a": 4}, 0, {"a": 0})
    assert [(r.owner, r.gpus, r.at) for r in plan] == [("x", 4, NOW + 60)]


def test_reclaim_never_takes_a_non_preemptible_holding() -> None:
    held = [Holding("b", "x", 8, since=0, lease_end=NOW + 60, preemptible=False)]
    assert plan_reclaim(NOW, [A, B], {"b": IMMEDIATE}, {"a": 4, "b": 4}, held, {"a": 4}, 0) == []


def test_a_waiting_high_priority_app_lets_its_queue_take_lower_priority_holdings() -> None:
    # Through the policy: a's waiting App has priority 5; B's Apps 1 and 9. LowerPriority takes from
    # the priority-1 App only.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=0)]
    rules = {"a": ReclaimRule(reclaim_within_cohort="LowerPriority"), "b": IMMEDIATE}
    apps = [
        ranked(app("b9", "b", 4, held=M0), 9),
        ranked(app("b1", "b", 4, held=M1), 1),
        ranked(app("a5", "a", 4), 5),
    ]
    d = allocate(QueuedPolicy(Themis(), qs, rules), apps, [])
    assert {k: len(v) for k, v in d.revoke.items()} == {"b1": 4}
    assert granted(d) == {"a5": 4}


# --- the minimum runtime counts from the start of the holding -------------------------------------------


def test_min_runtime_counts_from_the_holding_start_not_the_last_renewal() -> None:
    # The App started at t=0 and has held GPUs since t=100; a renewal at t=950 did not restart the
    # holding, so at t=1000 with a 600 s minimum runtime it may be reclaimed (since = 100).
    held = [Holding("b", "x", 8, since=100, lease_end=math.inf)]
    rules = {"b": ReclaimRule(mode="immediate", min_runtime_s=600)}
    assert len(plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, held, {"a": 4}, 0)) == 1
    fresh = [Holding("b", "x", 8, since=NOW - 10, lease_end=math.inf)]
    assert plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, fresh, {"a": 4}, 0) == []


def test_a_renewed_non_preemptible_app_is_not_short_of_gpus() -> None:
    # The priority-10 App is non-preemptible and its lease on m000 just ended: it gets m000 back, so it
    # wants nothing more, and the lower-priority App on m001 keeps its GPUs under withinQueue LowerPriority.
    qs = [QueueNode("a", guaranteed=8)]
    rules = {"a": ReclaimRule(within_queue="LowerPriority")}
    pinned = ranked(dataclasses.replace(app("pinned", "a", 4), previous=frozenset(M0)), 10, preemptible=False)
    d = allocate(QueuedPolicy(Themis(), qs, rules), [pinned, app("low", "a", 8, held=M1)], list(M0))
    assert d.revoke == {}
    assert granted(d) == {"pinned": 4}
