"""A Queue's status over every kind of object: what they hold and wait for, by kind, and the pending list
with why each object waits, on examples worked out by hand."""

from __future__ import annotations

import math
import random

from tessera.api.queue import PENDING_LIMIT, QueueSpec
from tessera.controller.metrics import operator_metrics
from tessera.controller.queue_status import RoundFacts, Workload, stamp, why_waiting
from tessera.controller.queues import QueueBook
from tessera.policy.queues import QueueNode, ReclaimRule
from tessera.policy.queues.reclaim import Holding, Reclaim
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis

from tests.unit.queues.test_queue_policies import CLUSTER, app

NOW = 1_000_000.0  # 1970-01-12T13:46:40Z


def spec(**kw: object) -> QueueSpec:
    return QueueSpec.model_validate(kw)


def book(**queues: QueueSpec) -> QueueBook:
    b = QueueBook()
    for name, s in queues.items():
        b.set_queue(name, s)
    return b


def test_every_kind_counts_and_the_longest_waiting_come_first() -> None:
    # Queue team: guaranteed 4, max 10. An App holds 3 and wants 1 more (short since 100 s ago), a
    # TrialGroup's pool holds 2, another TrialGroup waits for 4 (since 300 s ago), a ModelDeployment's one
    # replica of 2 GPUs runs and it waits for a second (since 50 s ago); a second App holds its 1.
    workloads = [
        Workload("App", "ns", "train", 3.0, 1.0, since=NOW - 100),
        Workload("App", "ns", "small", 1.0),
        Workload("TrialGroup", "ns", "sweep", 2.0),
        Workload("TrialGroup", "ns2", "wide", 0.0, 4.0, since=NOW - 300),
        Workload("ModelDeployment", "ns", "chat", 2.0, 2.0, since=NOW - 50),
    ]
    facts = RoundFacts(now=NOW, free=0, next_lease_end=NOW + 60)
    st = book(team=spec(guaranteedGPUs=4, maxGPUs=10)).status("team", workloads, 8.0, facts)
    # 3 + 1 + 2 + 2 = 8 held: 4 above the guarantee; demand 15 ≥ 4, nothing lent.
    assert (st.allocated_gpus, st.borrowed_gpus, st.lent_gpus, st.waiting) == (8, 4, 0, 3)
    assert st.allocated_by_kind.to_wire() == {
        "apps": 4.0,
        "trialGroups": 2.0,
        "modelDeployments": 2.0,
        "pods": 0.0,
    }
    assert st.waiting_by_kind.to_wire() == {"apps": 1, "trialGroups": 1, "modelDeployments": 1, "pods": 0}
    assert [(p.kind, p.name, p.gpus, p.since) for p in st.pending] == [
        ("TrialGroup", "wide", 4.0, stamp(NOW - 300)),
        ("App", "train", 1.0, stamp(NOW - 100)),
        ("ModelDeployment", "chat", 2.0, stamp(NOW - 50)),
    ]
    # The queue holds its whole share of 8: that is why all three wait.
    assert {p.reason for p in st.pending} == {"QueueAtShare"}
    assert st.pending[0].message == (
        "queue team holds 8 GPUs, its whole share this round (8); other queues' guarantees and weights "
        "take the rest"
    )
    wire = st.to_wire()
    assert wire["pending"][0] == {
        "kind": "TrialGroup",
        "namespace": "ns2",
        "name": "wide",
        "queue": "team",
        "gpus": 4.0,
        "since": "1970-01-12T13:41:40Z",
        "reason": "QueueAtShare",
        "message": st.pending[0].message,
    }


def test_an_idle_queue_lends_what_its_objects_do_not_hold_or_wait_for() -> None:
    # Guaranteed 6: a pool holds 1, a deployment waits for 2 → demand 3, lends 3 (lending limit 5 allows).
    workloads = [Workload("TrialGroup", "ns", "tg", 1.0), Workload("ModelDeployment", "ns", "md", 0.0, 2.0)]
    st = book(q=spec(guaranteedGPUs=6, lendingLimitGPUs=5)).status("q", workloads, 3.0)
    assert (st.allocated_gpus, st.borrowed_gpus, st.lent_gpus, st.waiting) == (1, 0, 3, 1)
    st = book(q=spec(guaranteedGPUs=6, lendingLimitGPUs=2)).status("q", workloads, 3.0)
    assert st.lent_gpus == 2  # at most its lending limit


def test_the_pending_list_is_bounded_and_waiting_counts_them_all() -> None:
    workloads = [Workload("App", "ns", f"a{i:03d}", 0.0, 1.0, since=NOW - i) for i in range(120)]
    st = book(q=spec()).status("q", workloads, 0.0, RoundFacts(now=NOW))
    assert st.waiting == 120 and len(st.pending) == PENDING_LIMIT == 50
    # Longest waiting first: a119 waited 119 s, a070 is the 50th.
    assert [p.name for p in st.pending[:2]] == ["a119", "a118"] and st.pending[-1].name == "a070"


def test_why_each_object_waits_in_order_of_precedence() -> None:
    q = spec(guaranteedGPUs=4, maxGPUs=8)
    tg = Workload("TrialGroup", "ns", "tg", 0.0, 4.0, reason="QueueRoom", message="4 wanted, 2 within")
    typed = Workload(
        "ModelDeployment", "ns", "md", 0.0, 1.0, reason="NoGPUOfType", message="no free GPU of H100"
    )
    a = Workload("App", "ns", "a", 0.0, 2.0)
    quiet = RoundFacts(now=NOW, free=3, next_round=NOW + 60)

    # At its maximum: nothing else matters.
    assert why_waiting(typed, "team", q, 8.0, 8.0, quiet) == (
        "QueueAtMax",
        "queue team holds 8 GPUs, its maxGPUs 8",
    )
    # A deployment that wants a GPU model none of the free GPUs is: its own reason first.
    assert why_waiting(typed, "team", q, 1.0, 4.0, quiet)[0] == "NoGPUOfType"

    # Below its guarantee, 3 GPUs being reclaimed from two lenders: the earliest is named.
    reclaims = [
        Reclaim("b/x", "b", "team", 2.0, NOW + 30, "immediate", "owed"),
        Reclaim("c/y", "c", "team", 1.0, NOW + 120, "atLeaseEnd", "owed"),
        Reclaim("c/z", "c", "other", 5.0, NOW + 1, "immediate", "owed"),  # for another queue
    ]
    facts = RoundFacts(now=NOW, reclaims=reclaims)
    assert why_waiting(a, "team", q, 1.0, 4.0, facts) == (
        "Reclaiming",
        "3 GPU(s) are being reclaimed for queue team (below its guarantee of 4) from b, c: the first "
        "immediate at 1970-01-12T13:47:10Z",
    )
    # Owed, but the lender's holdings are younger than its minimum runtime.
    facts = RoundFacts(now=NOW, blocked={"team": NOW + 500})
    reason, message = why_waiting(a, "team", q, 1.0, 4.0, facts)
    assert reason == "LenderMinRuntime" and message.endswith("the first may be taken at 1970-01-12T13:55:00Z")
    # Its whole share held: the share explains it before the object's own reason.
    assert why_waiting(tg, "team", q, 5.0, 5.0, quiet)[0] == "QueueAtShare"
    # Room left in the share, but less than the TrialGroup wants at once.
    assert why_waiting(tg, "team", q, 2.0, 4.0, quiet) == ("QueueRoom", "4 wanted, 2 within")
    # Room, and every GPU held: the next lease end is when one may come free.
    busy = RoundFacts(now=NOW, free=0, next_lease_end=NOW + 90)
    assert why_waiting(a, "team", q, 2.0, 4.0, busy) == (
        "NoFreeGPUs",
        "queue team has room (2 held of a share of 4) but no GPU is free; the next App lease ends at "
        "1970-01-12T13:48:10Z",
    )
    # Room and free GPUs: the next round hands them out.
    assert why_waiting(a, "team", q, 2.0, 4.0, quiet)[0] == "NextRound"


def test_the_policy_records_lease_end_reclaims_and_those_a_minimum_runtime_holds_back() -> None:
    # 8 GPUs, all held by b's App (b guaranteed 4); a (guaranteed 4) has an App waiting for 4.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=4)]
    b1 = app("b1", "b", 8, held=tuple(CLUSTER.gpu_ids), since=0.0)
    a1 = app("a1", "a", 4)
    # atLeaseEnd: nothing to do now, so nothing was planned; explained, the plan is recorded.
    plain = QueuedPolicy(Themis(), qs).allocate(1000.0, [a1, b1], CLUSTER, [], random.Random(0))
    assert plain.record["reclaims"] == []
    explained = QueuedPolicy(Themis(), qs, explain=True)
    d = explained.allocate(1000.0, [a1, b1], CLUSTER, [], random.Random(0))
    (r,) = d.record["reclaims"]
    assert (r.owner, r.from_queue, r.for_queue, r.gpus, r.mode, r.at) == (
        "b1",
        "b",
        "a",
        4.0,
        "atLeaseEnd",
        math.inf,  # an App's lease end: the operator dates it from the App's leases
    )
    assert d.revoke == {} and d.record["reclaim_blocked"] == {}
    # b's minimum runtime of 600 s, its App 100 s old: nothing can be taken before 1600.
    rules = {"b": ReclaimRule(mode="immediate", min_runtime_s=600.0)}
    young = app("b1", "b", 8, held=tuple(CLUSTER.gpu_ids), since=900.0)
    d = QueuedPolicy(Themis(), qs, rules, explain=True).allocate(
        1000.0, [a1, young], CLUSTER, [], random.Random(0)
    )
    assert d.record["reclaims"] == [] and d.record["reclaim_blocked"] == {"a": 1500.0}


def test_a_pool_younger_than_its_minimum_runtime_blocks_the_reclaim_until_it_is_not() -> None:
    qs = [QueueNode("a", guaranteed=2), QueueNode("b", guaranteed=6)]
    pool = Holding("a", "TrialGroup/ns/sweep", 8.0, since=0.0, lease_end=math.inf)
    rules = {"a": ReclaimRule(min_runtime_s=100.0)}
    policy = QueuedPolicy(Themis(), qs, rules, outside={"a": 8}, outside_holdings=[pool])
    early = policy.allocate(50.0, [app("b1", "b", 6)], CLUSTER, [], random.Random(0))
    assert early.record["reclaim_blocked"] == {"b": 100.0}
    late = policy.allocate(150.0, [app("b1", "b", 6)], CLUSTER, [], random.Random(0))
    assert late.record["reclaim_blocked"] == {} and len(late.record["reclaims"]) == 1


def test_the_gauges_by_kind() -> None:
    metrics = operator_metrics()
    b = book(q=spec(guaranteedGPUs=2))
    workloads = [
        Workload("App", "ns", "a", 1.0, 1.0),
        Workload("App", "ns", "b", 0.0, 2.0),
        Workload("TrialGroup", "ns", "t", 3.0),
        Workload("ModelDeployment", "ns", "m", 0.0, 1.0),
    ]
    b.export(metrics, "q", b.status("q", workloads, 4.0, RoundFacts(now=NOW)))

    def series(name: str) -> dict[str, float]:
        g = metrics.gauge(name)
        return {s.labels["kind"]: s.value for m in g.collect() for s in m.samples if s.labels["queue"] == "q"}

    assert series("tessera_queue_pending") == {"App": 2, "TrialGroup": 0, "ModelDeployment": 1, "Pod": 0}
    assert series("tessera_queue_kind_allocated_gpus") == {
        "App": 1,
        "TrialGroup": 3,
        "ModelDeployment": 0,
        "Pod": 0,
    }
    b.remove_queue("q", metrics)
    assert series("tessera_queue_pending") == {}
