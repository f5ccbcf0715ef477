"""Admission of gated pods of other kinds (controller/gate.py): grouping a Job's pods, BestEffortFIFO order
per queue, whole-group admission, and what the division sees of them (held, waiting, never taken)."""

from __future__ import annotations

import math
from typing import Any

from tessera.api import contract
from tessera.controller.gate import (
    Group,
    QueuedPods,
    decide,
    fifo,
    gate_patch,
    job_size,
    queued_pod,
)


def pod(
    name: str,
    gpus: int = 1,
    *,
    ns: str = "team",
    created: str = "2026-01-01T00:00:00Z",
    job: str | None = None,
    gated: bool = True,
    phase: str = "Pending",
    by_label: bool = False,
    other_gates: tuple[str, ...] = (),
    queued: bool = True,
    node: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "creationTimestamp": created,
        "resourceVersion": "7",
        "labels": {contract.LABEL_QUEUED: "true"} if queued else {},
    }
    if job and by_label:
        meta["labels"][contract.LABEL_JOB_NAME] = job
    elif job:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "controller": True}]
    gates = [*(contract.SCHEDULING_GATE_QUEUE,) * gated, *other_gates]
    return {
        "metadata": meta,
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {contract.RESOURCE_GPU: str(gpus)}}},
                {"name": "side"},
            ],
            "schedulingGates": [{"name": g} for g in gates],
            **({"nodeName": node} if node else {}),
        },
        "status": {"phase": phase},
    }


def book(*bodies: dict[str, Any], sizes: dict[tuple[str, str], int | None] | None = None) -> QueuedPods:
    out = QueuedPods()
    for b in bodies:
        out.on_pod(b)
    out.sizes.update(sizes or {})
    return out


def queue_of(ns: str) -> str:
    return {"team": "a", "other": "b"}.get(ns, "default")


def test_a_pod_is_read_as_the_policy_marked_it() -> None:
    p = queued_pod(pod("p", 2, job="train"))
    assert p is not None and p.gpus == 2 and p.gated and p.group == "Job/train"
    assert queued_pod(pod("p", job="train", by_label=True)).group == "Job/train"  # type: ignore[union-attr]
    assert queued_pod(pod("solo")).group == "Pod/solo"  # type: ignore[union-attr]
    assert queued_pod(pod("q", phase="Succeeded")).done  # type: ignore[union-attr]
    # A pod the policy did not mark is not the queue's.
    assert queued_pod(pod("x", queued=False)) is None


def test_the_gate_goes_and_other_gates_stay() -> None:
    p = queued_pod(pod("p", other_gates=("example.com/quota",)))
    assert p is not None
    assert gate_patch(p) == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"schedulingGates": [{"name": "example.com/quota"}]},
    }
    alone = queued_pod(pod("q"))
    assert alone is not None and gate_patch(alone)["spec"] == {"schedulingGates": None}


def test_a_jobs_size_is_its_parallelism_capped_by_what_it_still_lacks() -> None:
    assert job_size({"spec": {"parallelism": 2}}) == 2
    assert job_size({"spec": {}}) == 1
    assert job_size({"spec": {"parallelism": 4, "completions": 10}, "status": {"succeeded": 8}}) == 2
    assert job_size({"spec": {"parallelism": 4, "completions": 3}, "status": {"succeeded": 3}}) == 0


def test_oldest_group_first_per_queue_and_a_jobs_pods_together() -> None:
    b = book(
        pod("late", created="2026-01-01T00:05:00Z"),
        pod("w1", job="train", created="2026-01-01T00:02:00Z"),
        pod("w0", job="train", created="2026-01-01T00:01:00Z"),
        pod("early", created="2026-01-01T00:00:00Z", ns="other"),
        pod("running", gated=False),
    )
    order = fifo(b.groups(), queue_of)
    assert [g.key for g in order["a"]] == ["Job/train", "Pod/late"]  # the Job's oldest pod counts
    assert [g.key for g in order["b"]] == ["Pod/early"]
    train = order["a"][0]
    assert sorted(p.name for p in train.gated) == ["w0", "w1"] and train.waiting_gpus == 2


def run(
    b: QueuedPods, rooms: dict[str, float], max_gpus: dict[str, float] | None = None
) -> tuple[list[str], list[str]]:
    admitted, never, _ = decision(b, rooms, max_gpus)
    return admitted, never


def decision(
    b: QueuedPods, rooms: dict[str, float], max_gpus: dict[str, float] | None = None
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """decide() with each queue's room as a number the admitted groups use up."""
    left = dict(rooms)

    def room(g: Group) -> float | None:
        return left[queue_of(g.namespace)]

    def admitted(g: Group) -> None:
        left[queue_of(g.namespace)] -= g.waiting_gpus
        b.mark_admitted(g)

    d = decide(fifo(b.groups(), queue_of), lambda q: (max_gpus or {}).get(q), room, admitted)
    return [g.key for g in d.admit], [why for _, why in d.never], [(g.key, why) for g, why in d.waits]


def test_best_effort_fifo_a_group_that_does_not_fit_holds_no_smaller_one_back() -> None:
    b = book(
        pod("big", 3, created="2026-01-01T00:00:00Z"),
        pod("small", 1, created="2026-01-01T00:01:00Z"),
        pod("small2", 1, created="2026-01-01T00:02:00Z"),
    )
    admitted, never, waits = decision(b, {"a": 2})
    assert admitted == ["Pod/small", "Pod/small2"] and never == []
    assert waits == [("Pod/big", "its queue has room for 2 of its 3 GPUs")]
    # Admitted pods are the queue's holdings now, the big one still its waiting demand.
    assert b.held(queue_of) == {"a": 2.0}
    assert b.waiting(queue_of, lambda q: None) == {"a": 3.0}


def test_a_job_is_admitted_whole_or_not_at_all() -> None:
    sizes: dict[tuple[str, str], int | None] = {("team", "Job/train"): 2}
    one = book(pod("w0", job="train"), sizes=sizes)
    # Its second pod does not exist yet: nothing is admitted, however much room.
    assert decision(one, {"a": 8}) == ([], [], [("Job/train", "1 of its 2 pods exist")])
    both = book(pod("w0", job="train"), pod("w1", job="train"), sizes=sizes)
    assert run(both, {"a": 1}) == ([], [])  # room for one pod of two: none
    assert run(both, {"a": 2}) == (["Job/train"], [])
    assert not any(p.gated for p in both.pods.values())


def test_a_group_larger_than_its_queues_maximum_is_never_admitted_nor_waiting() -> None:
    b = book(pod("huge", 5), pod("ok", 1, created="2026-01-01T00:09:00Z"))
    admitted, never = run(b, {"a": 8}, {"a": 4})
    assert admitted == ["Pod/ok"]
    assert never == ["Pod/huge asks for 5 GPUs, more than its queue's maxGPUs of 4"]
    # It is not demand the division should reclaim for.
    assert b.waiting(queue_of, lambda q: 4.0) == {}
    # A Job's whole size counts, though only one of its pods exists yet.
    job = book(pod("w0", 2, job="t"), sizes={("team", "Job/t"): 3})
    assert run(job, {"a": 8}, {"a": 4})[1] == ["Job/t asks for 6 GPUs, more than its queue's maxGPUs of 4"]


def test_no_queues_admits_at_once() -> None:
    b = book(pod("p", 2))
    d = decide(fifo(b.groups(), queue_of), lambda q: None, lambda g: None, b.mark_admitted)
    assert [g.key for g in d.admit] == ["Pod/p"]


def test_admitted_pods_are_holdings_reclaim_never_takes() -> None:
    b = book(
        pod("w0", 2, job="t", gated=False, node="n1"),
        pod("w1", 2, job="t", gated=False, node="n1"),
        pod("done", gated=False, node="n1"),
        pod("unbound", 1, gated=False),
    )
    b.on_pod(pod("done", gated=False, phase="Succeeded", node="n1"))  # finished: holds nothing
    # Charged to the queue from admission on; a holding (and held, for the division) once bound.
    assert b.held(queue_of) == {"a": 5.0} and b.held(queue_of, bound_only=True) == {"a": 4.0}
    assert b.admitted_unbound() == 1
    (h,) = b.holdings(queue_of)
    assert (h.queue, h.owner, h.gpus) == ("a", "Job/team/t", 4.0)
    # Not preemptible, and "since forever": plan_reclaim never picks it.
    assert not h.preemptible and h.since == math.inf


def test_the_watch_tells_what_changed() -> None:
    b = QueuedPods()
    assert b.on_pod(pod("p"))
    assert not b.on_pod(pod("p"))  # a status heartbeat changes nothing admission reads
    assert b.on_pod(pod("p", gated=False))
    assert b.on_pod(pod("p", gated=False), deleted=True) and not b.pods
    assert not b.on_pod(pod("x", queued=False))


def test_queued_groups_in_the_queue_status() -> None:
    # Queue "q" (max 4): an admitted 2-GPU pod, a Job with 1 of its 2 pods so far, a gated 1-GPU pod, and a
    # pod that can never fit (5 GPUs). The status counts the admitted pod's GPUs under `pods`, lists the
    # two waiting groups (the Job waiting for its pods, with that reason) and leaves the never-fit one out.
    from tessera.api.queue import QueueSpec
    from tessera.controller.gate import group_workloads
    from tessera.controller.queue_status import RoundFacts, summary

    book = QueuedPods()
    for body in (
        pod("run", 2, gated=False, node="n1", phase="Running"),
        pod("j-0", 1, job="sweep", created="2026-01-01T00:00:01Z"),
        pod("wait", 1, created="2026-01-01T00:00:02Z"),
        pod("huge", 5, created="2026-01-01T00:00:03Z"),
    ):
        book.on_pod(body)
    book.sizes[("team", "Job/sweep")] = 2
    seen: dict[tuple[str, str], float] = {}
    rows = group_workloads(book, lambda ns: "q", lambda q: 4.0, seen, now=100.0)
    assert all(q == "q" for q, _ in rows)
    by_name = {w.name: w for _, w in rows}
    assert (by_name["run"].kind, by_name["run"].held, by_name["run"].wants) == ("Pod", 2.0, 0.0)
    assert (by_name["sweep"].kind, by_name["sweep"].wants, by_name["sweep"].reason) == (
        "Job",
        1.0,
        "WaitingForPods",
    )
    assert by_name["huge"].wants == 0.0
    assert set(seen) == {("team", "Job/sweep"), ("team", "Pod/wait")}
    rows_later = group_workloads(book, lambda ns: "q", lambda q: 4.0, seen, now=200.0)
    assert {w.name: w.since for _, w in rows_later if w.waiting} == {"sweep": 100.0, "wait": 100.0}

    status = summary(
        "q",
        QueueSpec(guaranteed_gpus=4, max_gpus=4),
        [w for _, w in rows],
        4.0,
        RoundFacts(now=100.0, free=0),
    )
    assert status["allocatedByKind"]["pods"] == 2.0 and status["allocatedGPUs"] == 2.0
    assert status["waitingByKind"]["pods"] == 2 and status["waiting"] == 2
    reasons = {e["name"]: e["reason"] for e in status["pending"]}
    assert reasons == {"sweep": "WaitingForPods", "wait": "NoFreeGPUs"}

    # Once the gated pod goes, it is no longer remembered as waiting.
    book.on_pod(pod("wait", 1), deleted=True)
    group_workloads(book, lambda ns: "q", lambda q: 4.0, seen, now=300.0)
    assert set(seen) == {("team", "Job/sweep")}
