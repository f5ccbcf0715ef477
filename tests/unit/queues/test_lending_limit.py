"""`lendingLimitGPUs`: the most of a queue's unused guarantee other queues may borrow. The rest of the
guarantee (guaranteed − lending limit) stays reserved for the queue, idle, while it does not use it."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tessera.policy.queues import QueueNode, divide, divide_with_reserves

BIG = 1000.0


def approx(d: dict[str, float]) -> dict[str, object]:
    return {k: pytest.approx(v) for k, v in d.items()}


def test_an_idle_queue_keeps_its_unlent_guarantee_out_of_others_reach() -> None:
    # 10 GPUs; A g=6 lending 2 is idle: 6 − 2 = 4 stay reserved for A, B (hungry) gets the other 6.
    qs = [QueueNode("a", guaranteed=6, lending_limit=2), QueueNode("b")]
    d = divide_with_reserves(10, qs, {"b": BIG})
    assert d.shares == approx({"a": 0, "b": 6})
    assert d.reserved == approx({"a": 4, "b": 0})
    assert divide(10, qs, {"b": BIG}) == d.shares


def test_without_a_lending_limit_nothing_is_reserved() -> None:
    qs = [QueueNode("a", guaranteed=6), QueueNode("b")]
    d = divide_with_reserves(10, qs, {"b": BIG})
    assert d.shares == approx({"a": 0, "b": 10})
    assert d.reserved == approx({"a": 0, "b": 0})


def test_a_lending_limit_of_the_whole_guarantee_lends_it_all() -> None:
    qs = [QueueNode("a", guaranteed=6, lending_limit=6), QueueNode("b")]
    assert divide_with_reserves(10, qs, {"b": BIG}).shares == approx({"a": 0, "b": 10})


def test_what_the_queue_uses_counts_towards_its_reserve() -> None:
    # A g=6 lending 2 (reserve 4) uses 3: 1 more stays idle for it; B gets 10 − 3 − 1 = 6.
    qs = [QueueNode("a", guaranteed=6, lending_limit=2), QueueNode("b")]
    d = divide_with_reserves(10, qs, {"a": 3, "b": BIG})
    assert d.shares == approx({"a": 3, "b": 6})
    assert d.reserved == approx({"a": 1, "b": 0})
    # Using 5 (above the reserve, within the guarantee): nothing idle is held back.
    d = divide_with_reserves(10, qs, {"a": 5, "b": BIG})
    assert d.shares == approx({"a": 5, "b": 5})
    assert d.reserved["a"] == pytest.approx(0)


def test_the_queues_own_work_gets_the_reserve_at_once() -> None:
    # The reserve is part of the guarantee: A's work arriving gets it in the same division.
    qs = [QueueNode("a", guaranteed=6, lending_limit=2), QueueNode("b")]
    assert divide_with_reserves(10, qs, {"a": BIG, "b": BIG}).shares == approx({"a": 8, "b": 2})


def test_a_childs_reserve_is_kept_from_its_siblings_and_from_outside_its_parent() -> None:
    # 16 GPUs. P g=8 has children X (g 4, lending 1: reserve 3, idle) and Y (g 4); Q is top-level.
    qs = [
        QueueNode("p", guaranteed=8),
        QueueNode("x", guaranteed=4, lending_limit=1, parent="p"),
        QueueNode("y", guaranteed=4, parent="p"),
        QueueNode("q"),
    ]
    # Y and Q hungry. Top: P 8 + 4 of the rest (weights 1:1) = 12, Q 4. Inside P: X's 3 stay idle, Y 9.
    d = divide_with_reserves(16, qs, {"y": BIG, "q": BIG})
    assert d.shares == approx({"p": 9, "x": 0, "y": 9, "q": 4})
    assert d.reserved == approx({"p": 0, "x": 3, "y": 0, "q": 0})
    # Only Q hungry: P keeps X's 3 (P lends the other 5 of its guarantee), Q gets 13.
    d = divide_with_reserves(16, qs, {"q": BIG})
    assert d.shares == approx({"p": 0, "x": 0, "y": 0, "q": 13})
    assert d.reserved["x"] == pytest.approx(3)


def test_a_parents_lending_limit_bounds_what_its_whole_subtree_lends() -> None:
    # P g=8 lending 2 (reserve 6) with child X (g 4, lending 1: reserve 3), all idle; Q hungry.
    # X keeps 3; P keeps 6 in all, so 3 more for any of its queues; Q gets 16 − 6 = 10.
    qs = [
        QueueNode("p", guaranteed=8, lending_limit=2),
        QueueNode("x", guaranteed=4, lending_limit=1, parent="p"),
        QueueNode("y", guaranteed=4, parent="p"),
        QueueNode("q"),
    ]
    d = divide_with_reserves(16, qs, {"q": BIG})
    assert d.shares == approx({"p": 0, "x": 0, "y": 0, "q": 10})
    assert d.reserved == approx({"p": 3, "x": 3, "y": 0, "q": 0})
    # Y's work takes P's own reserve first (it is inside P): Y 3, nothing of P's idle but X's 3.
    d = divide_with_reserves(16, qs, {"y": 3, "q": BIG})
    assert d.shares == approx({"p": 3, "x": 0, "y": 3, "q": 10})
    assert d.reserved == approx({"p": 0, "x": 3, "y": 0, "q": 0})


def test_reserves_shrink_with_the_guarantees_when_capacity_falls_short() -> None:
    # 6 GPUs for guarantees 6 and 3 (a node failed); A idle with lending 0, B hungry: by guarantee 2:1.
    qs = [QueueNode("a", guaranteed=6, lending_limit=0), QueueNode("b", guaranteed=3)]
    d = divide_with_reserves(6, qs, {"b": BIG})
    assert d.shares == approx({"a": 0, "b": 2})
    assert d.reserved["a"] == pytest.approx(4)


names = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.floats(0, 64),
    specs=st.dictionaries(
        names,
        st.tuples(
            st.floats(0, 16),
            st.floats(0, 64) | st.just(math.inf),
            st.floats(0.1, 8),
            st.floats(0, 64),
            st.floats(0, 16) | st.just(math.inf),
        ),
        min_size=1,
    ),
)
def test_invariants_with_lending_limits(
    capacity: float, specs: dict[str, tuple[float, float, float, float, float]]
) -> None:
    qs = [
        QueueNode(n, guaranteed=g, max=max(m, g), weight=w, lending_limit=min(lend, g))
        for n, (g, m, w, _, lend) in specs.items()
    ]
    demand = {n: d for n, (_, _, _, d, _) in specs.items()}
    d = divide_with_reserves(capacity, qs, demand)
    assert sum(d.shares.values()) + sum(d.reserved.values()) <= capacity + 1e-6
    for q in qs:
        assert d.shares[q.name] <= min(demand[q.name], q.max) + 1e-6
        assert d.reserved[q.name] <= max(0.0, q.guaranteed - q.lending_limit - demand[q.name]) + 1e-6
    need = sum(max(min(demand[q.name], q.max), q.guaranteed - q.lending_limit) for q in qs)
    assert sum(d.shares.values()) + sum(d.reserved.values()) == pytest.approx(min(capacity, need), abs=1e-6)
    if sum(q.guaranteed for q in qs) <= capacity:
        for q in qs:
            assert d.shares[q.name] >= min(q.guaranteed, demand[q.name]) - 1e-6
            idle = max(0.0, q.guaranteed - q.lending_limit - demand[q.name])
            assert d.reserved[q.name] == pytest.approx(idle, abs=1e-6)


# --- the policies that use the division, and the Kueue-style baseline -----------------------------------

from tessera.policy.queues.kai import kai_style  # noqa: E402
from tessera.policy.queues.kueue import KueueStyle  # noqa: E402
from tessera.policy.queues.training import QueuedPolicy, entitled_and_reserved  # noqa: E402
from tessera.policy.themis import Themis  # noqa: E402
from tessera.policy.training import check_decision  # noqa: E402

from .test_queue_policies import CLUSTER, app, granted  # noqa: E402

LENDER = [QueueNode("a", guaranteed=4, lending_limit=1), QueueNode("b", guaranteed=2)]  # a keeps 3


def test_whole_gpu_reserves_are_rounded_with_the_shares() -> None:
    # 8 GPUs; a (reserve 3) idle, b hungry: b 5, a's 3 held back.
    shares, reserved = entitled_and_reserved(8, LENDER, {"b": 8})
    assert (shares["b"], reserved["a"]) == (5, 3)
    # a lends 1.5 of 4 (reserve 2.5): the halves round to whole GPUs within the capacity.
    qs = [QueueNode("a", guaranteed=4, lending_limit=1.5), QueueNode("b", guaranteed=2)]
    shares, reserved = entitled_and_reserved(8, qs, {"b": 8})
    assert shares["b"] + reserved["a"] == 8 and {shares["b"], reserved["a"]} == {5, 3}


def test_tessera_and_kai_style_leave_the_reserve_free_while_the_lender_is_idle() -> None:
    apps = [app("b1", "b", 8)]
    for policy in (QueuedPolicy(Themis(), LENDER), kai_style(LENDER)):
        d = policy.allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids, random.Random(0))
        check_decision(d, apps, CLUSTER.gpu_ids)
        assert granted(d) == {"b1": 5}, policy.name  # not 8: the second pass keeps a's 3 too


def test_the_lenders_app_gets_the_reserve_in_the_round_it_arrives() -> None:
    held = tuple(CLUSTER.gpu_ids[:5])
    apps = [app("b1", "b", 8, held=held), app("a1", "a", 3, arrival=10.0)]
    free = CLUSTER.gpu_ids[5:]
    d = QueuedPolicy(Themis(), LENDER).allocate(10.0, apps, CLUSTER, free, random.Random(0))
    check_decision(d, apps, free)
    assert granted(d) == {"a1": 3}


def test_kueue_style_borrows_only_the_lendable_part_of_an_idle_nominal_quota() -> None:
    # b (nominal 2) may borrow a's lendable 1 and the 2 GPUs no nominal quota covers, not a's reserved 3:
    # a 7-GPU job waits, a 5-GPU one is admitted. Without the lending limit the 7-GPU job is admitted.
    assert granted(
        KueueStyle([QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=2)]).allocate(
            0.0, [app("b1", "b", 7)], CLUSTER, CLUSTER.gpu_ids, random.Random(0)
        )
    ) == {"b1": 7}
    d = KueueStyle(LENDER).allocate(0.0, [app("b1", "b", 7)], CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {}
    d = KueueStyle(LENDER).allocate(0.0, [app("b1", "b", 5)], CLUSTER, CLUSTER.gpu_ids, random.Random(0))
    assert granted(d) == {"b1": 5}
    # Within its own reserve a queue is admitted as before.
    apps = [app("b1", "b", 5, held=tuple(CLUSTER.gpu_ids[:5])), app("a1", "a", 3)]
    d = KueueStyle(LENDER).allocate(0.0, apps, CLUSTER, CLUSTER.gpu_ids[5:], random.Random(0))
    assert granted(d) == {"a1": 3}


def test_the_operator_feeds_the_lending_limit_to_the_division_and_reports_what_it_lends() -> None:
    from tessera.api.queue import QueueSpec
    from tessera.controller.queues import QueueBook

    book = QueueBook()
    book.set_queue("a", QueueSpec.model_validate({"guaranteedGPUs": 4, "lendingLimitGPUs": 1}))
    book.set_queue("b", QueueSpec.model_validate({"guaranteedGPUs": 2}))
    nodes = {n.name: n for n in book.nodes()}
    assert (nodes["a"].lending_limit, nodes["a"].reserve) == (1, 3)
    assert nodes["b"].lending_limit == math.inf
    # Idle, a lends 1 of its 4 (not 4); b, idle with no limit, lends its 2.
    assert book.status("a", [], 0.0).lent_gpus == 1
    assert book.status("b", [], 0.0).lent_gpus == 2
    # A queue that breaks a hierarchy rule loses its guarantee, so it keeps no reserve either.
    book.set_queue(
        "a", QueueSpec.model_validate({"guaranteedGPUs": 4, "lendingLimitGPUs": 1, "parent": "nope"})
    )
    assert {n.name: n for n in book.nodes()}["a"].reserve == 0


# --- the simulator ------------------------------------------------------------------------------------


def _sim(lending_limit: float | None, policy: str) -> tuple[int, float]:
    """8 GPUs; team-b (guaranteed 2) runs two apps of four 1-GPU jobs from t=0, team-a (guaranteed 4) is
    idle until its 3-GPU app arrives at t=900. Returns the most GPUs team-b held until then and the time
    a's app took."""
    from tessera.sim.training import scenario as training
    from tessera.sim.training.simulator import simulate

    a: dict[str, object] = {"name": "team-a", "guaranteed": 4}
    if lending_limit is not None:
        a["lending_limit"] = lending_limit
    b_jobs = [{"iterations": 1000, "iter_time": 4, "gpus": 1}] * 4
    raw = {
        "kind": "training",
        "cluster": {"machines": [{"count": 2, "slots": 1, "gpus_per_slot": 4}]},
        "trace": {
            "apps": [
                {"id": "b1", "arrival": 0, "queue": "team-b", "jobs": b_jobs},
                {"id": "b2", "arrival": 0, "queue": "team-b", "jobs": b_jobs},
                {
                    "id": "a1",
                    "arrival": 900,
                    "queue": "team-a",
                    "jobs": [{"iterations": 300, "iter_time": 3, "gpus": 3}],
                },
            ]
        },
        "policies": [policy],
        "lease_s": 600,
        "themis": {"lease_s": 600},
        "sim": {"restart_s": 0},
        "queues": [a, {"name": "team-b", "guaranteed": 2}],
    }
    sc = training.load(raw, "lending.yaml")
    b_held = [0]

    def observe(now: float, sim: Any) -> None:  # what held since the last instant
        if now <= 900:
            b_held[0] = max(
                b_held[0], sum(len(x.held) for x in sim.live.values() if x.spec.queue == "team-b")
            )

    trace = sc.resolved_trace()
    run = simulate(sc.policies[0].build(), sc.cluster, trace, random.Random(1), sc.sim, observers=[observe])
    a1 = next(x for x in run.apps if x.app_id == "a1")
    return b_held[0], a1.finish - a1.arrival


@pytest.mark.parametrize("policy", ["themis", "kueue-style"])
def test_in_the_simulator_the_reserve_waits_idle_for_its_team(policy: str) -> None:
    alone = 300 * 3 / 3  # a's app alone on 3 GPUs of one machine
    b_max, a_jct = _sim(1, policy)
    assert b_max <= 5  # 8 less a's reserve of 3
    assert a_jct == pytest.approx(alone, rel=0.05)  # a's app started at once on the reserve
    b_max, a_jct = _sim(None, policy)
    assert b_max == 8  # without the limit team-b borrows all of a's idle guarantee
    if policy == "themis":  # a's app waits for team-b's lease to end (Kueue-style preempts b2 at once)
        assert a_jct > alone * 1.2


def test_the_scenario_refuses_a_lending_limit_above_the_guarantee() -> None:
    from tessera.sim.scenario import ScenarioError
    from tessera.sim.training import scenario as training

    raw = {"kind": "training", "queues": [{"name": "a", "guaranteed": 2, "lending_limit": 3}]}
    with pytest.raises(ScenarioError, match=r"queues\[0\]\.lending_limit.*must be <= guaranteed"):
        training.load(raw, "lending.yaml")


def test_the_worked_example_of_docs_queues_md() -> None:
    # docs/queues.md, "Keeping GPUs ready for a team": 16 GPUs, inference (g 4, lending 1) idle; vision and
    # platform hungry, speech wants 1. Research and platform share 13, inference keeps 3.
    qs = [
        QueueNode("research", guaranteed=8),
        QueueNode("vision", guaranteed=4, parent="research"),
        QueueNode("speech", guaranteed=2, parent="research"),
        QueueNode("platform", guaranteed=4, max=8),
        QueueNode("inference", guaranteed=4, lending_limit=1),
    ]
    demand = {"vision": BIG, "speech": 1, "platform": BIG}
    d = divide_with_reserves(16, qs, demand)
    assert d.shares["research"] + d.shares["platform"] == pytest.approx(13)
    assert d.reserved["inference"] == pytest.approx(3)
    # Its App asking for 3 gets them in that division.
    assert divide_with_reserves(16, qs, {**demand, "inference": 3}).shares["inference"] == pytest.approx(3)
