"""Team queues around training policies: Tessera's wrapper (division + Themis), the KAI-style and the
Kueue-style baselines, on rounds small enough to work out by hand."""

from __future__ import annotations

import math
import random

from tessera.cluster import NETWORK_INTENSIVE, Cluster
from tessera.policy.queues import QueueNode, ReclaimRule
from tessera.policy.queues.kai import kai_style
from tessera.policy.queues.kueue import KueueStyle
from tessera.policy.queues.reclaim import Holding
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis
from tessera.policy.training import AppState, RoundDecision, check_decision

CLUSTER = Cluster.homogeneous(2, 4)  # m000/0..3, m001/0..3


class _Linear:
    """An app whose work divides evenly over its GPUs."""

    def __init__(self, work: float) -> None:
        self.work = work

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return math.inf if gpus <= 0 else self.work * slowdown / gpus


def app(
    app_id: str, queue: str, demand: int, held: tuple[str, ...] = (), arrival: float = 0.0, since: float = 0.0
) -> AppState:
    return AppState(
        app_id=app_id,
        arrival=arrival,
        demand_max=demand,
        held=frozenset(held),
        sensitivity=NETWORK_INTENSIVE,
        total_work=3600.0 * demand,
        remaining_work=3600.0 * demand,
        attained_service=0.0,
        n_avg=1.0,
        estimator=_Linear(3600.0 * demand),
        queue=queue,
        since=since,
    )


def granted(d: RoundDecision) -> dict[str, int]:
    return {k: len(v) for k, v in d.granted().items()}


def test_each_queue_gets_its_share_and_themis_shares_it() -> None:
    # 8 GPUs, A g=6, B g=2, both hungry for 8: the division gives 6 and 2.
    qs = [QueueNode("a", guaranteed=6), QueueNode("b", guaranteed=2)]
    apps = [app("a1", "a", 8), app("b1", "b", 8)]
    d = QueuedPolicy(Themis(), qs).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    check_decision(d, apps, CLUSTER.gpu_ids)
    assert granted(d) == {"a1": 6, "b1": 2}


def test_idle_guarantee_is_borrowed_and_max_holds() -> None:
    # B has no work: A borrows, but only up to its maximum of 5.
    qs = [QueueNode("a", guaranteed=2, max=5), QueueNode("b", guaranteed=6)]
    apps = [app("a1", "a", 8)]
    d = QueuedPolicy(Themis(), qs).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {"a1": 5}


def test_objects_of_unknown_queues_go_to_default() -> None:
    qs = [QueueNode("a", guaranteed=8)]
    apps = [app("x", "nope", 2)]
    d = QueuedPolicy(Themis(), qs).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {"x": 2}


def test_immediate_reclaim_takes_back_from_the_borrower_after_min_runtime() -> None:
    # B borrowed all 8; A (g 4) arrives. B lends under `immediate` with a 600 s minimum runtime.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    rules = {"b": ReclaimRule(mode="immediate", min_runtime_s=600, grace_s=0)}
    policy = QueuedPolicy(Themis(), qs, rules)
    b1 = app("b1", "b", 8, held=tuple(CLUSTER.gpu_ids), since=0.0)
    a1 = app("a1", "a", 4, arrival=100.0)
    young = policy.allocate(300.0, [a1, b1], CLUSTER, [], random.Random(0))
    assert young.revoke == {} and young.grants == []  # not before the minimum runtime
    d = policy.allocate(900.0, [a1, b1], CLUSTER, [], random.Random(0))
    check_decision(d, [a1, b1], [])
    assert {k: len(v) for k, v in d.revoke.items()} == {"b1": 4}
    assert granted(d) == {"a1": 4}


def test_at_lease_end_reclaim_takes_nothing_before_the_lease_ends() -> None:
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    policy = QueuedPolicy(Themis(), qs)  # atLeaseEnd by default
    b1 = app("b1", "b", 8, held=tuple(CLUSTER.gpu_ids))
    d = policy.allocate(900.0, [app("a1", "a", 4), b1], CLUSTER, [], random.Random(0))
    assert d.revoke == {} and d.grants == []


def test_kai_style_is_drf_inside_a_queue() -> None:
    # One queue of 8 GPUs, two apps: DRF gives one GPU at a time to the smaller share → 4 and 4.
    qs = [QueueNode("a", guaranteed=8)]
    apps = [app("a1", "a", 8), app("a2", "a", 8, arrival=1.0)]
    d = kai_style(qs).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {"a1": 4, "a2": 4}
    assert all(g.expiry == math.inf for g in d.grants)  # held until done


def test_kueue_style_strict_fifo_admits_whole_workloads_and_borrows() -> None:
    # A (nominal 4, max 8): its head wants 6 → borrows B's idle quota; the next (4) does not fit and
    # blocks the 1-GPU one behind it (StrictFIFO).
    qs = [QueueNode("a", guaranteed=4, max=8), QueueNode("b", guaranteed=4)]
    apps = [app("a1", "a", 6, arrival=0), app("a2", "a", 4, arrival=1), app("a3", "a", 1, arrival=2)]
    d = KueueStyle(qs).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {"a1": 6}


def test_kueue_style_preempts_the_borrower_to_reclaim_nominal_quota() -> None:
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    old = app("b1", "b", 4, held=tuple(CLUSTER.gpu_ids[:4]), since=0.0)
    new = app("b2", "b", 4, held=tuple(CLUSTER.gpu_ids[4:]), since=50.0)
    a1 = app("a1", "a", 4, arrival=100.0)
    d = KueueStyle(qs).allocate(100.0, [old, new, a1], CLUSTER, [], random.Random(0))
    check_decision(d, [old, new, a1], [])
    assert set(d.revoke) == {"b2"}  # the most recently admitted borrower
    assert granted(d) == {"a1": 4}


def test_kueue_best_effort_fifo_lets_a_smaller_workload_pass_one_that_does_not_fit() -> None:
    # The strict test's queue under Kueue's default BestEffortFIFO: a2 (4) does not fit A's maximum of 8
    # next to a1's 6, so it is set aside and a3 (1) behind it is admitted.
    qs = [QueueNode("a", guaranteed=4, max=8), QueueNode("b", guaranteed=4)]
    apps = [app("a1", "a", 6, arrival=0), app("a2", "a", 4, arrival=1), app("a3", "a", 1, arrival=2)]
    d = KueueStyle(qs, queueing_strategy="BestEffortFIFO").allocate(
        0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0)
    )
    assert granted(d) == {"a1": 6, "a3": 1}


def test_kueue_reclaim_within_cohort_never_waits_for_the_borrowers() -> None:
    # Kueue's default `reclaimWithinCohort: Never`: A's workload fits its nominal quota, but B borrows
    # every GPU; nothing is preempted and A waits.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    old = app("b1", "b", 4, held=tuple(CLUSTER.gpu_ids[:4]), since=0.0)
    new = app("b2", "b", 4, held=tuple(CLUSTER.gpu_ids[4:]), since=50.0)
    a1 = app("a1", "a", 4, arrival=100.0)
    policy = KueueStyle(qs, reclaim_within_cohort="Never")
    d = policy.allocate(100.0, [old, new, a1], CLUSTER, [], random.Random(0))
    assert not d.revoke and not d.grants
    assert not policy.preempts


def test_kueue_admits_workloads_within_nominal_quota_before_older_borrowers() -> None:
    # 4 GPUs free. A (nominal 2, max 8) offers an older 4-GPU workload that would borrow; B (nominal 4)
    # a newer 4-GPU one within its nominal quota. Kueue's cycle orders heads within nominal quota first.
    qs = [QueueNode("a", guaranteed=2, max=8), QueueNode("b", guaranteed=4)]
    held = app("a0", "a", 4, held=tuple(CLUSTER.gpu_ids[:4]), since=0.0)
    apps = [held, app("a1", "a", 4, arrival=1.0), app("b1", "b", 4, arrival=2.0)]
    for strategy in ("StrictFIFO", "BestEffortFIFO"):
        d = KueueStyle(
            qs, queueing_strategy=strategy, reclaim_within_cohort="Never"
        ).allocate(  # type: ignore[arg-type]
            10.0, apps, CLUSTER, CLUSTER.gpu_ids[4:], random.Random(0)
        )
        assert granted(d) == {"b1": 4}, strategy


def test_gpus_a_queue_holds_outside_the_policy_count_against_its_share() -> None:
    # A (g 4) already holds 3 GPUs in a TrialGroup pool; B (g 4). 8 GPUs, both hungry: A's Apps get 1 more.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    apps = [app("a1", "a", 8), app("b1", "b", 8)]
    free = CLUSTER.gpu_ids[3:]
    d = QueuedPolicy(Themis(), qs, outside={"a": 3}).allocate(0.0, apps, CLUSTER, free, random.Random(0))
    assert granted(d) == {"a1": 1, "b1": 4}


def test_gpus_a_queues_other_objects_wait_for_are_reclaimed_and_kept_for_them() -> None:
    # B (g 4) borrows all 8 GPUs; A (g 4) has no App, only a TrialGroup waiting for 3 GPUs. Under
    # `immediate`, 3 of B's GPUs are taken back, and neither B (hungry for 8) nor anyone else gets them.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    rules = {"b": ReclaimRule(mode="immediate")}
    b1 = app("b1", "b", 8, held=tuple(CLUSTER.gpu_ids))
    policy = QueuedPolicy(Themis(), qs, rules, outside_waiting={"a": 3})
    assert policy.reclaim_due([("b", 8, 8)], 0)  # a round at once
    d = policy.allocate(100.0, [b1], CLUSTER, [], random.Random(0))
    check_decision(d, [b1], [])
    assert len(d.revoke["b1"]) == 3 and d.grants == []


def test_free_gpus_a_queues_other_objects_wait_for_are_not_lent() -> None:
    # 8 free GPUs at lease end; A's TrialGroup waits for 2 within A's guarantee: B's hungry App gets 6,
    # not 8, and A's own App gets none of the 2 (they wait for the TrialGroup).
    qs = [QueueNode("a", guaranteed=2), QueueNode("b", guaranteed=6)]
    apps = [app("a1", "a", 8), app("b1", "b", 8)]
    policy = QueuedPolicy(Themis(), qs, outside_waiting={"a": 2})
    d = policy.allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {"b1": 6}
    # Without the waiting TrialGroup the same round lends every GPU.
    d = QueuedPolicy(Themis(), qs).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert sum(granted(d).values()) == 8


def test_a_pool_held_outside_the_policy_is_asked_to_give_back_what_another_queue_is_owed() -> None:
    # A (g 2) holds all 8 GPUs in a TrialGroup pool; B (g 6) has an App wanting 6. The pool is asked for
    # 6 (either mode: its owner acts on it), but only once it has run A's minimum runtime.
    qs = [QueueNode("a", guaranteed=2), QueueNode("b", guaranteed=6)]
    pool = Holding("a", "TrialGroup/ns/sweep", 8.0, since=0.0, lease_end=math.inf)
    for mode in ("atLeaseEnd", "immediate"):
        rules = {"a": ReclaimRule(mode=mode, min_runtime_s=100.0, grace_s=7.0)}  # type: ignore[arg-type]
        policy = QueuedPolicy(Themis(), qs, rules, outside={"a": 8}, outside_holdings=[pool])
        early = policy.allocate(50.0, [app("b1", "b", 6)], CLUSTER, [], random.Random(0))
        assert early.record["outside_reclaims"] == []
        d = policy.allocate(150.0, [app("b1", "b", 6)], CLUSTER, [], random.Random(0))
        (r,) = d.record["outside_reclaims"]
        assert (r.owner, r.for_queue, r.gpus, r.mode, r.grace_s) == (
            "TrialGroup/ns/sweep",
            "b",
            6.0,
            mode,
            7.0,
        )
        assert d.revoke == {} and d.grants == []  # nothing free yet: the owner gives the GPUs back


HIERARCHY = [
    QueueNode("org", guaranteed=4, max=6),
    QueueNode("x", guaranteed=2, parent="org"),
    QueueNode("y", guaranteed=2, parent="org"),
]


def test_a_parents_maximum_caps_a_childs_burst() -> None:
    # x (no maximum of its own) is entitled to org's 6; the work-conserving pass gave it all 8 GPUs.
    d = QueuedPolicy(Themis(), HIERARCHY).allocate(
        0.0, [app("x1", "x", 8)], CLUSTER, CLUSTER.gpu_ids, random.Random(0)
    )
    check_decision(d, [app("x1", "x", 8)], CLUSTER.gpu_ids)
    assert granted(d) == {"x1": 6}


def test_a_sibling_waits_for_the_lease_end_while_the_parent_is_at_its_maximum() -> None:
    # x holds org's 6 (its lease runs); y arrives, entitled to 2: the 2 free GPUs would take org to 8.
    x1 = app("x1", "x", 8, held=tuple(CLUSTER.gpu_ids[:6]))
    policy = QueuedPolicy(Themis(), HIERARCHY)
    d = policy.allocate(1.0, [x1, app("y1", "y", 2)], CLUSTER, CLUSTER.gpu_ids[6:], random.Random(0))
    assert d.grants == []
    # x's lease ends: org's 6 are divided 4 and 2.
    d = policy.allocate(
        2.0, [app("x1", "x", 8), app("y1", "y", 2)], CLUSTER, CLUSTER.gpu_ids, random.Random(0)
    )
    assert granted(d) == {"x1": 4, "y1": 2}


def test_under_immediate_a_sibling_gets_its_guarantee_back_at_once_within_the_parents_maximum() -> None:
    # As above, x lending under `immediate`: 2 of x's GPUs are taken now, and y gets 2 while org holds 6.
    rules = {"x": ReclaimRule(mode="immediate", grace_s=0)}
    x1 = app("x1", "x", 8, held=tuple(CLUSTER.gpu_ids[:6]))
    d = QueuedPolicy(Themis(), HIERARCHY, rules).allocate(
        1.0, [x1, app("y1", "y", 2)], CLUSTER, CLUSTER.gpu_ids[6:], random.Random(0)
    )
    check_decision(d, [x1, app("y1", "y", 2)], CLUSTER.gpu_ids[6:])
    assert {k: len(v) for k, v in d.revoke.items()} == {"x1": 2} and granted(d) == {"y1": 2}
