"""The operator's QueueBook: namespace → queue, the QueueResolved condition and its events, invalid
hierarchies held capped, status figures, series removal."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from tessera.api import contract
from tessera.api.base import Condition
from tessera.api.queue import QueueSpec
from tessera.controller.apps import record_from_body
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import make_registry
from tessera.controller.metrics import operator_metrics
from tessera.controller.queue_status import Workload
from tessera.controller.queues import QUEUE_RESOLVED, QueueBook, membership_news
from tessera.controller.readiness import app_conditions
from tessera.policy.queues.division import divide


def spec(**kw: object) -> QueueSpec:
    return QueueSpec.model_validate(kw)


def test_namespace_label_picks_the_queue_else_default() -> None:
    book = QueueBook()
    book.set_queue("team-a", spec(guaranteedGPUs=4))
    book.set_namespace("ns-a", {contract.LABEL_QUEUE: "team-a"})
    book.set_namespace("ns-x", {contract.LABEL_QUEUE: "nope"})
    book.set_namespace("ns-plain", {})
    assert [book.queue_of(n) for n in ("ns-a", "ns-x", "ns-plain", "never-seen")] == [
        "team-a",
        *["default"] * 3,
    ]
    assert book.remove_queue("team-a") == ["ns-a"]
    assert book.queue_of("ns-a") == "default"


def test_a_label_naming_a_missing_queue_is_a_false_queueresolved_until_the_queue_exists() -> None:
    """The defect: a namespace labelled with a queue that does not exist went to `default` silently."""
    book = QueueBook()
    book.set_queue("team-a", spec(guaranteedGPUs=4))
    book.set_namespace("ns-x", {contract.LABEL_QUEUE: "ghost"})
    book.set_namespace("ns-a", {contract.LABEL_QUEUE: "team-a"})
    book.set_namespace("ns-d", {contract.LABEL_QUEUE: "default"})
    book.set_namespace("ns-plain", {})
    missing = book.membership("ns-x", generation=2)
    assert missing is not None
    assert (missing["type"], missing["status"], missing["reason"]) == (
        QUEUE_RESOLVED,
        "False",
        "QueueNotFound",
    )
    assert missing["observedGeneration"] == 2
    assert missing["message"] == (
        "namespace ns-x is labelled tessera.io/queue=ghost, but no Queue ghost exists: in queue default "
        "until that Queue is created or the label is changed"
    )
    Condition.model_validate(missing, by_alias=True)  # the CRD's condition shape (CamelCase reason)
    for ns, queue in (("ns-a", "team-a"), ("ns-d", "default")):
        found = book.membership(ns)
        assert found is not None and (found["status"], found["reason"]) == ("True", "QueueFound")
        assert found["message"].endswith(f"in queue {queue}")
    assert book.membership("ns-plain") is None and book.membership("never-seen") is None
    book.set_queue("ghost", spec())
    now = book.membership("ns-x")
    assert now is not None and now["status"] == "True" and book.queue_of("ns-x") == "ghost"
    book.remove_queue("ghost")  # deleted again: missing again
    again = book.membership("ns-x")
    assert again is not None and again["status"] == "False"


def _membership(book: QueueBook, namespace: str) -> dict[str, Any]:
    cond = book.membership(namespace)
    assert cond is not None
    return cond


def test_membership_news_is_posted_once_per_change() -> None:
    book = QueueBook()
    book.set_namespace("ns", {contract.LABEL_QUEUE: "ghost"})
    missing = _membership(book, "ns")
    assert membership_news(missing, []) == ("Warning", "QueueNotFound", missing["message"])
    assert membership_news(missing, [dict(missing)]) is None  # already said
    book.set_namespace("ns", {contract.LABEL_QUEUE: "phantom"})
    other = _membership(book, "ns")
    news = membership_news(other, [missing])  # another missing queue: news again
    assert news is not None and news[:2] == ("Warning", "QueueNotFound") and "phantom" in news[2]
    book.set_queue("phantom", spec())
    found = _membership(book, "ns")
    assert membership_news(found, [other]) == ("Normal", "QueueResolved", found["message"])
    assert membership_news(found, [found]) is None and membership_news(found, []) is None
    gone = membership_news(None, [other])  # the label removed
    assert gone is not None and gone[:2] == ("Normal", "QueueResolved") and "in queue default" in gone[2]
    assert membership_news(None, [found]) is None and membership_news(None, None) is None


def test_an_apps_conditions_carry_queueresolved_between_admitted_and_ready() -> None:
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": "a", "namespace": "ns", "uid": "u-a", "generation": 4},
        "spec": {
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
            "jobs": [{"name": "j", "iterTotal": 10, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1}],
        },
    }
    rec = record_from_body(body, 0.0)
    book = QueueBook()
    book.set_namespace("ns", {contract.LABEL_QUEUE: "ghost"})
    conds = app_conditions(rec, [], previous=[], queue=book.membership("ns"))["conditions"]
    assert [c["type"] for c in conds] == ["Admitted", QUEUE_RESOLVED, "Ready"]
    assert conds[1]["status"] == "False" and conds[1]["observedGeneration"] == 4
    old = [{**conds[1], "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    again = app_conditions(rec, [], previous=old, queue=book.membership("ns"))["conditions"]
    assert again[1]["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # unchanged: nothing new to write
    assert [c["type"] for c in app_conditions(rec, [], previous=[])["conditions"]] == ["Admitted", "Ready"]


def test_the_book_is_kept_by_indexers_so_no_handler_runs_before_it_is_loaded() -> None:
    """kopf runs no handler until every index holds its first listing. Kept by event handlers alone, the
    book could still lack the Queues or the namespace labels when an operator's first round ran: on a real
    API server a restarted operator dropped the QueueResolved condition of a labelled namespace's App."""
    registry, ctl = make_registry(OperatorConfig())
    indexers = {str(h.id): h for h in registry._indexing.get_all_handlers()}
    assert {"queue_book", "namespace_book"} <= set(indexers)
    queue = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_QUEUE,
        "metadata": {"name": "team-a", "uid": "u-q"},
        "spec": {"guaranteedGPUs": 2},
    }
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "ns", "labels": {contract.LABEL_QUEUE: "team-a"}},
    }
    asyncio.run(indexers["queue_book"].fn(body=kopf.Body(queue), name="team-a"))
    asyncio.run(indexers["namespace_book"].fn(body=kopf.Body(ns), name="ns"))
    assert ctl.queues.queue_of("ns") == "team-a" and ctl.queues.uids["team-a"] == "u-q"
    alone, _ = make_registry(OperatorConfig(watch_namespaces=False))  # no Namespace watch: no index of them
    assert {str(h.id) for h in alone._indexing.get_all_handlers()} & {"queue_book", "namespace_book"} == {
        "queue_book"
    }


def test_a_queue_breaking_the_hierarchy_stays_capped_without_its_guarantee() -> None:
    book = QueueBook()
    book.set_queue("org", spec(guaranteedGPUs=4))
    book.set_queue("a", spec(guaranteedGPUs=2, parent="org"))
    book.set_queue("b", spec(guaranteedGPUs=3, maxGPUs=5, parent="missing"))
    book.set_namespace("ns-b", {contract.LABEL_QUEUE: "b"})
    assert book.invalid() == {"b"}
    nodes = {n.name: n for n in book.nodes()}
    assert (nodes["b"].guaranteed, nodes["b"].max, nodes["b"].parent) == (0.0, 5, None)
    assert (nodes["a"].guaranteed, nodes["a"].parent) == (2, "org")
    assert book.queue_of("ns-b") == "b"  # its objects stay under its cap, not moved to default
    st = book.status("b", [], 0.0)
    assert st.conditions[0].status == "False" and "spec.parent" in (st.conditions[0].message or "")
    assert "its maximum still caps it" in (st.conditions[0].message or "")


def test_children_of_an_invalid_parent_stay_within_its_maximum() -> None:
    """The defect: org (guaranteed 4, max 6) became invalid (its own parent is missing) and was dropped from
    the division; its children became top-level queues with no cap and took 9 of 16 GPUs."""
    book = QueueBook()
    book.set_queue("org", spec(guaranteedGPUs=4, maxGPUs=6, parent="missing"))
    book.set_queue("a", spec(guaranteedGPUs=2, parent="org"))
    book.set_queue("b", spec(guaranteedGPUs=2, parent="org"))
    book.set_queue("other", spec(guaranteedGPUs=4))
    shares = divide(16, book.nodes(), {"a": 16, "b": 16, "other": 4})
    assert shares["a"] + shares["b"] <= 6 + 1e-9
    assert shares["other"] == 4


def test_a_cycle_is_cut_and_its_queues_stay_capped() -> None:
    book = QueueBook()
    book.set_queue("x", spec(maxGPUs=3, parent="y"))
    book.set_queue("y", spec(maxGPUs=5, parent="x"))
    assert book.invalid() == {"x", "y"}
    shares = divide(16, book.nodes(), {"x": 16, "y": 16})  # no DivisionError: the cycle is cut
    assert shares["x"] <= 3 + 1e-9 and shares["y"] <= 5 + 1e-9


def test_status_figures() -> None:
    # team-a guaranteed 4 holds 6 (borrowed 2); one App waits. team-b guaranteed 4, demand 1 → lends 3.
    book = QueueBook()
    book.set_queue("team-a", spec(guaranteedGPUs=4))
    book.set_queue("team-b", spec(guaranteedGPUs=4))
    a_apps = [Workload("App", "ns", "a1", 6.0), Workload("App", "ns", "a2", 0.0, 2.0, since=10.0)]
    a = book.status("team-a", a_apps, 6.0, max_rho=3.0)
    assert (a.allocated_gpus, a.borrowed_gpus, a.lent_gpus, a.waiting, a.max_rho) == (6, 2, 0, 1, 3.0)
    b = book.status("team-b", [Workload("App", "ns", "b1", 0.0, 1.0)], 1.0)
    assert (b.allocated_gpus, b.borrowed_gpus, b.lent_gpus, b.waiting, b.max_rho) == (0, 0, 3, 1, None)


def test_a_parents_status_is_its_subtrees() -> None:
    # org (guaranteed 6, max 8) ⊃ mid (guaranteed 4) ⊃ leaf (guaranteed 2). leaf's App holds 3 of its share 3
    # and waits for 2 more; mid's own App holds 2 (share 2); org's own App holds 1, share 1 and waits for 1
    # (since 5, before leaf's since 10); org's whole subtree holds 6 of its maximum 8.
    book = QueueBook()
    book.set_queue("org", spec(guaranteedGPUs=6, maxGPUs=8))
    book.set_queue("mid", spec(parent="org", guaranteedGPUs=4))
    book.set_queue("leaf", spec(parent="mid", guaranteedGPUs=2))
    by_queue = {
        "org": [Workload("App", "o", "o1", 1.0, 1.0, since=5.0)],
        "mid": [Workload("App", "m", "m1", 2.0)],
        "leaf": [Workload("App", "l", "l1", 3.0, 2.0, since=10.0)],
    }
    st = book.statuses(by_queue, {"org": 1.0, "mid": 2.0, "leaf": 3.0}, max_rho={"leaf": 1.5, "org": 1.2})
    org, mid, leaf = st["org"], st["mid"], st["leaf"]
    # org: 6 held of a share of 6 → nothing borrowed (guarantee 6); demand 9 ≥ 6, nothing lent; 2 wait.
    assert (org.share_gpus, org.allocated_gpus, org.borrowed_gpus, org.lent_gpus, org.waiting) == (
        6,
        6,
        0,
        0,
        2,
    )
    assert org.own is not None and org.own.to_wire() == {"shareGPUs": 1.0, "allocatedGPUs": 1.0, "waiting": 1}
    assert [(p.queue, p.name) for p in org.pending] == [("org", "o1"), ("leaf", "l1")]
    assert org.max_rho == 1.5 and org.allocated_by_kind.apps == 6
    # mid: 5 held (2 + 3) of a share of 5, guarantee 4 → borrowed 1; its own part is m1.
    assert (mid.share_gpus, mid.allocated_gpus, mid.borrowed_gpus, mid.waiting) == (5, 5, 1, 1)
    assert mid.own is not None and (mid.own.allocated_gpus, mid.own.waiting) == (2, 0)
    # leaf: no children, no `own`; it holds 3, 1 above its guarantee of 2.
    assert (leaf.allocated_gpus, leaf.borrowed_gpus, leaf.waiting, leaf.own) == (3, 1, 1, None)
    # The reason is the object's own queue's: l1's queue holds its whole share.
    assert [p.reason for p in leaf.pending] == ["QueueAtShare"] == [p.reason for p in org.pending[1:]]
    # org's maximum caps its subtree: at 8 held in all, org's own waiting App is QueueAtMax.
    by_queue["mid"] = [Workload("App", "m", "m1", 4.0)]
    org = book.statuses(by_queue, {"org": 1.0, "mid": 4.0, "leaf": 3.0})["org"]
    assert org.allocated_gpus == 8 and org.pending[0].reason == "QueueAtMax"


def test_a_deleted_queues_series_go() -> None:
    metrics = operator_metrics()
    book = QueueBook()
    book.set_queue("team-a", spec(guaranteedGPUs=4))
    book.export(metrics, "team-a", book.status("team-a", [], 4.0))
    g = metrics.gauge("tessera_queue_guaranteed_gpus")
    assert [s.value for m in g.collect() for s in m.samples if s.labels.get("queue") == "team-a"] == [4.0]
    book.remove_queue("team-a", metrics)
    assert not [s for m in g.collect() for s in m.samples if s.labels.get("queue") == "team-a"]
