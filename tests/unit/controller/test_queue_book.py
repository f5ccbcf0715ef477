"""The operator's QueueBook: namespace → queue, invalid hierarchies held capped, status figures, series removal."""

from __future__ import annotations

import dataclasses

from tessera.api import contract
from tessera.api.queue import QueueSpec
from tessera.controller.metrics import operator_metrics
from tessera.controller.queues import QueueBook
from tessera.policy.queues.division import divide
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
    st = book.status("b", [], 0.0, {})
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
