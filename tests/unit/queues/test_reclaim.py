"""Reclaim rules against hand-worked cases."""

from __future__ import annotations

import math

from tessera.policy.queues import Holding, QueueNode, ReclaimRule, plan_reclaim

A = QueueNode("a", guaranteed=4)
B = QueueNode("b", guaranteed=0)
NOW = 1000.0


def test_immediate_takes_the_newest_holding_after_the_grace() -> None:
    rules = {"b": ReclaimRule(mode="immediate", grace_s=30)}
    held = [
        Holding("b", "old", 4, since=0, lease_end=math.inf),
        Holding("b", "new", 4, since=500, lease_end=math.inf),
    ]
    plan = plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, held, {"a": 4}, free=0)
    assert [(r.owner, r.from_queue, r.for_queue, r.gpus, r.at) for r in plan] == [
        ("new", "b", "a", 4, NOW + 30)
    ]
    assert "below its guarantee of 4 GPUs" in plan[0].reason


def test_at_lease_end_waits_for_the_lease() -> None:
    held = [Holding("b", "x", 8, since=0, lease_end=NOW + 120)]
    plan = plan_reclaim(NOW, [A, B], {}, {"a": 4, "b": 4}, held, {"a": 4}, free=0)
    assert [(r.owner, r.gpus, r.at, r.mode) for r in plan] == [("x", 4, NOW + 120, "atLeaseEnd")]


def test_minimum_runtime_protects_young_holdings() -> None:
    rules = {"b": ReclaimRule(mode="immediate", min_runtime_s=600)}
    young = [Holding("b", "x", 8, since=NOW - 60, lease_end=math.inf)]
    assert plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, young, {"a": 4}, free=0) == []
    old = [Holding("b", "x", 8, since=NOW - 600, lease_end=math.inf)]
    assert len(plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, old, {"a": 4}, free=0)) == 1


def test_never_takes_a_lender_below_its_own_guarantee() -> None:
    # B is guaranteed 6 and holds 8: only 2 can go, though A is owed 4.
    b6 = QueueNode("b", guaranteed=6)
    held = [Holding("b", "x", 8, since=0, lease_end=0)]
    plan = plan_reclaim(NOW, [A, b6], {}, {"a": 4, "b": 6}, held, {"a": 4}, free=0)
    assert [r.gpus for r in plan] == [2]


def test_free_gpus_are_used_before_anything_is_reclaimed() -> None:
    held = [Holding("b", "x", 8, since=0, lease_end=0)]
    assert plan_reclaim(NOW, [A, B], {}, {"a": 4, "b": 4}, held, {"a": 4}, free=4) == []
    assert [r.gpus for r in plan_reclaim(NOW, [A, B], {}, {"a": 4, "b": 4}, held, {"a": 4}, free=1)] == [3]


def test_no_waiting_work_no_reclaim() -> None:
    held = [Holding("b", "x", 8, since=0, lease_end=0)]
    assert plan_reclaim(NOW, [A, B], {}, {"a": 0, "b": 8}, held, {}, free=0) == []


def test_reclaims_only_up_to_what_the_claimant_waits_for() -> None:
    held = [Holding("b", "x", 8, since=0, lease_end=0)]
    assert [r.gpus for r in plan_reclaim(NOW, [A, B], {}, {"a": 4, "b": 4}, held, {"a": 1.5}, free=0)] == [
        1.5
    ]


def test_free_gpus_a_full_parent_cannot_take_cover_nothing_and_only_a_sibling_gives_back() -> None:
    # 10 GPUs. org (max 6) holds x and y; x holds org's 6, y (guaranteed 2) waits for 2; z, outside org,
    # holds 2 above its share of 0; 2 GPUs are free. y can use neither the free GPUs nor z's (org would
    # hold 8): x gives the 2 back.
    org = QueueNode("org", guaranteed=4, max=6)
    x = QueueNode("x", guaranteed=2, parent="org")
    y = QueueNode("y", guaranteed=2, parent="org")
    z = QueueNode("z")
    rules = {q: ReclaimRule(mode="immediate", grace_s=0) for q in ("x", "z")}
    held = [
        Holding("x", "burst", 6, since=0, lease_end=math.inf),
        Holding("z", "late", 2, since=500, lease_end=math.inf),  # the newest: first to go but for the cap
    ]
    shares = {"org": 6, "x": 4, "y": 2, "z": 0}
    plan = plan_reclaim(NOW, [org, x, y, z], rules, shares, held, {"y": 2}, free=2)
    assert [(r.owner, r.from_queue, r.for_queue, r.gpus) for r in plan] == [("burst", "x", "y", 2)]
    # Once org has room, the free GPUs come first and nothing is taken.
    fewer = [Holding("x", "burst", 4, since=0, lease_end=math.inf), held[1]]
    assert plan_reclaim(NOW, [org, x, y, z], rules, shares, fewer, {"y": 2}, free=2) == []
