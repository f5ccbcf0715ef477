"""borrowWithinCohort: a queue above its guarantee taking the rest of its share at once from lower-priority
holdings of queues borrowing beyond theirs, against hand-worked cases (the policy and a round through
QueuedPolicy, which the operator and the simulator both run)."""

from __future__ import annotations

import math
from typing import Any

from tessera.policy.queues import Holding, QueueNode, ReclaimRule, plan_reclaim
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis
from tessera.sim.training import scenario as training

from tests.unit.queues.test_priority import M0, M1, NOW, allocate, granted, ranked
from tests.unit.queues.test_queue_policies import app

A = QueueNode("a", guaranteed=2)
B = QueueNode("b", guaranteed=2)
LOWER = ReclaimRule(borrow_within_cohort="LowerPriority")
IMMEDIATE = ReclaimRule(mode="immediate", grace_s=0)


def _plan(
    claimant: ReclaimRule, lender: ReclaimRule = IMMEDIATE, priority: int = 0
) -> list[tuple[str, float]]:
    # 8 GPUs, both queues want 6: the division gives each its 2, then 4 by weight → a 4, b 4. a holds its
    # guarantee (2) and waits for 4 more at priority 100; b holds 6, 2 above its share. Below its guarantee
    # a is owed nothing: only borrowing within the cohort takes b's 2 before b's lease ends.
    held = [
        Holding("a", "a-run", 2, since=0, lease_end=NOW + 300, priority=100),
        Holding("b", "b-run", 6, since=0, lease_end=NOW + 300, priority=priority),
    ]
    rules = {"a": claimant, "b": lender}
    plan = plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, held, {"a": 4}, 0, {"a": 100})
    return [(r.owner, r.gpus, r.at, r.mode) for r in plan]


def test_lower_priority_takes_the_rest_of_the_share_at_once_from_a_lower_priority_borrower() -> None:
    assert _plan(LOWER) == [("b-run", 2, NOW, "immediate")]


def test_never_the_default_waits_for_the_lease() -> None:
    assert _plan(ReclaimRule()) == []
    assert _plan(ReclaimRule(reclaim_within_cohort="Any")) == []  # reclaim is below the guarantee only


def test_equal_or_higher_priority_and_at_lease_end_lenders_are_not_taken() -> None:
    assert _plan(LOWER, priority=100) == []
    assert _plan(LOWER, priority=101) == []
    assert _plan(LOWER, lender=ReclaimRule()) == []  # b lends under atLeaseEnd: its lease end returns them
    assert _plan(LOWER, lender=ReclaimRule(mode="immediate", min_runtime_s=NOW + 1)) == []


def test_max_priority_threshold_bounds_the_priority_taken() -> None:
    at_most_10 = ReclaimRule(borrow_within_cohort="LowerPriority", borrow_max_priority=10)
    assert _plan(at_most_10, priority=10) == [("b-run", 2, NOW, "immediate")]
    assert _plan(at_most_10, priority=11) == []


def test_the_guarantee_comes_first_then_the_borrowed_part() -> None:
    # a holds nothing and waits for 6 at priority 10: owed 2 below its guarantee (reclaim), and 2 more up
    # to its share of 4 (borrowing); b holds 8 at priority 0, 4 above its share. One free GPU covers the
    # guarantee's first GPU.
    held = [Holding("b", "b-run", 8, since=0, lease_end=math.inf)]
    rules = {"a": LOWER, "b": IMMEDIATE}
    plan = plan_reclaim(NOW, [A, B], rules, {"a": 4, "b": 4}, held, {"a": 6}, 1, {"a": 10})
    assert [r.gpus for r in plan] == [1, 2]
    assert "below its guarantee" in plan[0].reason and "borrowWithinCohort" in plan[1].reason


def test_only_borrowers_of_lower_priority_give_and_never_below_their_share() -> None:
    # 12 GPUs, three queues guaranteed nothing, all wanting more than 4: shares 4 each. b and c hold 6 each
    # (2 above their share), b's at priority 0, c's at 50; a waits for 4 at priority 20: it takes b's 2.
    qs = [QueueNode("a"), QueueNode("b"), QueueNode("c")]
    held = [
        Holding("b", "b-run", 6, since=0, lease_end=math.inf, priority=0),
        Holding("c", "c-run", 6, since=0, lease_end=math.inf, priority=50),
    ]
    rules = {"a": LOWER, "b": IMMEDIATE, "c": IMMEDIATE}
    plan = plan_reclaim(NOW, qs, rules, {"a": 4, "b": 4, "c": 4}, held, {"a": 4}, 0, {"a": 20})
    assert [(r.owner, r.for_queue, r.gpus) for r in plan] == [("b-run", "a", 2)]


def test_a_round_moves_the_gpus_from_the_lower_priority_borrower() -> None:
    # 8 GPUs, a and b guaranteed 2 each, both wanting 6: shares 4 and 4. b's App (priority 0) borrowed 6
    # while a was idle; a's App (priority 100) holds 2 and wants 6. Under LowerPriority the round takes 2
    # of b's GPUs and grants them to a's App; under Never it takes nothing.
    qs = [A, B]
    apps = [
        ranked(app("a-high", "a", 6, held=M1[2:]), 100),
        ranked(app("b-low", "b", 6, held=M0 + M1[:2]), 0),
    ]
    d = allocate(QueuedPolicy(Themis(), qs, {"a": LOWER, "b": IMMEDIATE}), apps, [])
    assert {k: len(v) for k, v in d.revoke.items()} == {"b-low": 2}
    assert granted(d) == {"a-high": 2}
    d = allocate(QueuedPolicy(Themis(), qs, {"b": IMMEDIATE}), apps, [])
    assert d.revoke == {} and granted(d) == {}


def sim_finishes(borrow: str, high_priority: int = 10) -> dict[str, float]:
    """The simulator on 8 GPUs: queues a and b guaranteed 2 each, b lending under `immediate`. b's `low`
    (6 GPUs for 1 h) arrives at 0 and borrows; a's `high` (4 GPUs for 10 min) at 60 s, when the division
    gives a 4 (2 free at once, 2 of b's above its share of 4). Each app's finish time."""
    data: dict[str, Any] = {
        "kind": "training",
        "seed": 1,
        "cluster": {"machines": [{"count": 2, "slots": 1, "gpus_per_slot": 4}]},
        "queues": [
            {"name": "a", "guaranteed": 2, "borrow_within_cohort": borrow},
            {"name": "b", "guaranteed": 2, "reclaim": "immediate", "grace_s": 0},
        ],
        "policies": [{"policy": "themis", "label": "tessera"}],
        "themis": {"lease_s": SIM_LEASE_S},
        "sim": {"restart_s": 0},
        "trace": {
            "apps": [
                {
                    "id": "low",
                    "queue": "b",
                    "arrival": 0,
                    "jobs": [{"iterations": 3600, "iter_time": 6.0, "gpus": 6}],
                },
                {
                    "id": "high",
                    "queue": "a",
                    "arrival": 60,
                    "priority": high_priority,
                    "jobs": [{"iterations": 600, "iter_time": 4.0, "gpus": 4}],
                },
            ]
        },
    }
    result = training.run(training.load(data, "test"), workers=1)
    return {x.app_id: x.finish for x in result.runs[0].apps}


SIM_LEASE_S = 600.0


def test_in_the_simulator_lower_priority_borrowing_starts_the_high_priority_app_at_once() -> None:
    # b's 2 GPUs above its share are taken in the round high arrives in (at most a round gap later).
    assert sim_finishes("LowerPriority")["high"] <= 60 + 60 + 600 + 1


def test_in_the_simulator_never_waits_for_the_borrowers_lease() -> None:
    # high runs on a's 2 free GPUs (half speed) until b's lease ends at 600, then on 4: 270 s of its 600 s
    # of work done by then, the other 330 s after → 930.
    assert sim_finishes("Never")["high"] >= SIM_LEASE_S + 300 - 1
    assert sim_finishes("LowerPriority", high_priority=0)["high"] >= SIM_LEASE_S + 300 - 1
