"""The operator's QueueBook: namespace → queue, invalid hierarchies left out, status figures, series removal."""

from __future__ import annotations

import dataclasses

from tessera.api import contract
from tessera.api.queue import QueueSpec
from tessera.controller.metrics import operator_metrics
from tessera.controller.queues import QueueBook
from tessera.policy.training import AppState

from tests.unit.queues.test_queue_policies import app


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


def test_queues_breaking_the_hierarchy_leave_the_division() -> None:
    book = QueueBook()
    book.set_queue("org", spec(guaranteedGPUs=4))
    book.set_queue("a", spec(guaranteedGPUs=2, parent="org"))
    book.set_queue("b", spec(parent="missing"))
    assert book.invalid() == {"b"}
    assert [n.name for n in book.nodes()] == ["a", "org"]
    st = book.status("b", [], 0.0, {})
    assert st.conditions[0].status == "False" and "spec.parent" in (st.conditions[0].message or "")


def _in(queue: str, a: AppState) -> AppState:
    return dataclasses.replace(a, queue=queue)


def test_status_figures() -> None:
    # team-a guaranteed 4 holds 6 (borrowed 2); one App waits. team-b guaranteed 4, demand 1 → lends 3.
    book = QueueBook()
    book.set_queue("team-a", spec(guaranteedGPUs=4))
    book.set_queue("team-b", spec(guaranteedGPUs=4))
    gpus = [f"n/{i}" for i in range(6)]
    apps = [
        _in("team-a", app("ns/a1", "x", 6, held=tuple(gpus))),
        _in("team-a", app("ns/a2", "x", 2)),
        _in("team-b", app("ns/b1", "x", 1)),
    ]
    a = book.status("team-a", apps, 6.0, {"ns/a1": 1.5, "ns/a2": 3.0})
    assert (a.allocated_gpus, a.borrowed_gpus, a.lent_gpus, a.waiting, a.max_rho) == (6, 2, 0, 1, 3.0)
    b = book.status("team-b", apps, 1.0, {})
    assert (b.allocated_gpus, b.borrowed_gpus, b.lent_gpus, b.waiting, b.max_rho) == (0, 0, 3, 1, None)


def test_a_deleted_queues_series_go() -> None:
    metrics = operator_metrics()
    book = QueueBook()
    book.set_queue("team-a", spec(guaranteedGPUs=4))
    book.export(metrics, "team-a", book.status("team-a", [], 4.0, {}))
    g = metrics.gauge("tessera_queue_guaranteed_gpus")
    assert [s.value for m in g.collect() for s in m.samples if s.labels.get("queue") == "team-a"] == [4.0]
    book.remove_queue("team-a", metrics)
    assert not [s for m in g.collect() for s in m.samples if s.labels.get("queue") == "team-a"]
