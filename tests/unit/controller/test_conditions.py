"""Status conditions (controller/conditions.py) and what Ready means per kind (controller/readiness.py):
transition times kept while a status holds, Ready after a kind's own conditions, the invalid report, and
each kind's Ready from its record and the pods its plan calls for. No Kubernetes."""

from __future__ import annotations

import json
from typing import Any

from tessera.api import contract
from tessera.api.app import Condition
from tessera.controller import serving, trialgroups
from tessera.controller.apps import record_from_body
from tessera.controller.conditions import Readiness, carry, condition, invalid_status, with_ready
from tessera.controller.readiness import (
    app_conditions,
    app_readiness,
    deployment_readiness,
    missing_pods,
    trialgroup_readiness,
)
from tessera.controller.sync import RecentCreates
from tessera.controller.view import ClusterView, PodInfo

T0 = 1_700_000_000.0
TEMPLATE = {"spec": {"containers": [{"name": "c", "image": "x"}]}}
OLD = "2026-01-01T00:00:00Z"


def cluster_of(nodes: dict[str, int]) -> Any:
    view = ClusterView()
    for name, n in nodes.items():
        inv = [{"uuid": f"{name}-{i}", "index": i, "memoryMiB": 16384} for i in range(n)]
        view.on_node({"metadata": {"name": name, "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}})
    return view.cluster()


def meta(name: str, generation: int | None = 3) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"u-{name}"}
    if generation is not None:
        out["generation"] = generation
    return out


def shaped(r: Readiness) -> Readiness:
    """`r` as a Ready condition passes the CRD's Condition schema (CamelCase reason, as metav1 wants))."""
    Condition.model_validate(condition("Ready", r.ok, r.reason, r.message, generation=1), by_alias=True)
    return r


def pod(name: str, *, deleting: bool = False) -> PodInfo:
    return PodInfo("ml", name, {}, None, (), "Pending", deleting)


def test_carry_keeps_the_transition_time_while_the_status_holds() -> None:
    old = [{**condition("Ready", True, "Running", "x"), "lastTransitionTime": OLD}]
    same = carry([condition("Ready", True, "Running", "other message")], old)
    flipped = carry([condition("Ready", False, "WaitingForGPUs", "x")], old)
    assert same[0]["lastTransitionTime"] == OLD and same[0]["message"] == "other message"
    assert flipped[0]["lastTransitionTime"] != OLD
    assert carry([condition("Admitted", True, "Admitted", "x")], old)[0]["lastTransitionTime"] != OLD


def test_ready_follows_the_kinds_own_conditions_and_replaces_an_old_ready() -> None:
    own = [condition("Valid", True, "Planned", "ok"), {**condition("Ready", False, "X", "stale")}]
    out = with_ready(own, Readiness(True, "Running", "fine"), 4, previous=None)
    assert [(c["type"], c["status"], c["reason"]) for c in out] == [
        ("Valid", "True", "Planned"),
        ("Ready", "True", "Running"),
    ]
    assert out[1]["observedGeneration"] == 4 and "observedGeneration" not in out[0]
    # The shape the CRD accepts (metav1.Condition: CamelCase reason, RFC 3339 time).
    for c in out:
        Condition.model_validate(c, by_alias=True)


def test_invalid_status_sets_valid_and_ready_false_with_every_field() -> None:
    previous = [{**condition("Ready", False, "WaitingForGPUs", "x"), "lastTransitionTime": OLD}]
    status, msg = invalid_status([("spec.a", "bad"), ("spec.b", "worse")], generation=2, previous=previous)
    valid, ready = status["conditions"]
    assert status["phase"] == "Failed" and status["observedGeneration"] == 2
    assert msg == "spec.a: bad; spec.b: worse"
    assert (valid["type"], valid["status"], valid["reason"], valid["message"]) == (
        "Valid",
        "False",
        "InvalidSpec",
        msg,
    )
    assert (ready["type"], ready["status"], ready["reason"], ready["message"]) == (
        "Ready",
        "False",
        "InvalidSpec",
        msg,
    )
    assert ready["lastTransitionTime"] == OLD  # it was False already
    assert valid["observedGeneration"] == ready["observedGeneration"] == 2


def test_missing_pods_counts_fresh_creates_and_not_pods_being_deleted() -> None:
    rec = record_from_body({"metadata": meta("a"), **app_spec()}, T0)
    rec.grant(["n1/0", "n2/0"], T0 + 60, "auction", cluster_of({"n1": 1, "n2": 1}))
    p1, p2 = rec.pod_plans()
    recent = RecentCreates()
    assert missing_pods([p1, p2], [], recent, "ml") == [p1, p2]
    recent.add("ml", [p1.name])  # created, not listed by the watch yet
    assert missing_pods([p1, p2], [], recent, "ml") == [p2]
    assert missing_pods([p1, p2], [pod(p2.name, deleting=True)], recent, "ml") == [p2]
    assert missing_pods([p1, p2], [pod(p2.name)], recent, "ml") == []


def app_spec(**status: Any) -> dict[str, Any]:
    job = {"name": "j1", "iterTotal": 100, "iterTimeSerialSeconds": 1.0, "maxGPUs": 2}
    out: dict[str, Any] = {"apiVersion": contract.API_VERSION, "kind": "App"}
    out["spec"] = {"template": TEMPLATE, "jobs": [job]}
    if status:
        out["status"] = status
    return out


def test_app_ready_waits_for_a_lease_then_for_its_pods_and_holds_once_done() -> None:
    rec = record_from_body({"metadata": meta("a"), **app_spec()}, T0)
    waiting = shaped(app_readiness(rec, []))
    assert (waiting.ok, waiting.reason) == (False, "WaitingForGPUs") and "up to 2 GPUs" in waiting.message
    rec.grant(["n1/0", "n1/1"], T0 + 60, "auction", cluster_of({"n1": 2}))
    plans = rec.pod_plans()
    missing = shaped(app_readiness(rec, plans))
    assert (missing.ok, missing.reason) == (False, "PodsNotCreated") and "job(s) j1" in missing.message
    running = shaped(app_readiness(rec, []))
    assert (running.ok, running.reason, running.message) == (
        True,
        "Running",
        "2 GPUs leased to job(s) j1; their pods are created",
    )
    rec.done_iters["j1"] = 100
    assert shaped(app_readiness(rec, plans)) == Readiness(True, "Succeeded", "all jobs completed")


def test_app_conditions_carry_times_from_the_object_after_a_restart() -> None:
    stored = [
        {**condition("Admitted", True, "Admitted", "x"), "lastTransitionTime": OLD},
        {**condition("Ready", False, "WaitingForGPUs", "x"), "lastTransitionTime": OLD},
    ]
    rec = record_from_body({"metadata": meta("a", 5), **app_spec(conditions=stored)}, T0)
    out = app_conditions(rec, [], previous=None)
    admitted, ready = out["conditions"]
    assert (
        out["observedGeneration"] == 5 and admitted["observedGeneration"] == ready["observedGeneration"] == 5
    )
    assert admitted["lastTransitionTime"] == OLD and ready["lastTransitionTime"] == OLD
    # What this operator wrote last wins over the (older) object it parsed.
    newer = [{**condition("Ready", True, "Running", "x"), "lastTransitionTime": "2026-02-02T00:00:00Z"}]
    assert app_conditions(rec, [], previous=newer)["conditions"][1]["lastTransitionTime"] != OLD
    assert "observedGeneration" not in app_conditions(
        record_from_body({"metadata": meta("b", None), **app_spec()}, T0), [], None
    )


def tg_record(trials: int, gpus: int) -> trialgroups.TrialGroupRecord:
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": "TrialGroup",
        "metadata": meta("tg"),
        "spec": {
            "template": TEMPLATE,
            "trials": [{"name": f"t{i}", "budgetIterations": 10} for i in range(trials)],
            "gpus": gpus,
        },
    }
    return trialgroups.record_from_body(body)


def test_trialgroup_ready_needs_a_pool_a_plan_and_the_planned_pods() -> None:
    rec = tg_record(2, 2)
    assert shaped(trialgroup_readiness(rec, [])).reason == "WaitingForGPUs"
    cluster = cluster_of({"n1": 2})
    rec.pool = ["n1/0", "n1/1"]
    assert shaped(trialgroup_readiness(rec, [])).reason == "NotPlanned"
    rec.plan(cluster)
    plans = rec.pod_plans()
    assert len(plans) == 2
    missing = shaped(trialgroup_readiness(rec, plans[1:]))
    assert (missing.ok, missing.reason) == (False, "PodsNotCreated")
    assert missing.message.startswith(f"pods of trial(s) {plans[1].labels[contract.LABEL_TRIAL]} ")
    assert shaped(trialgroup_readiness(rec, [])) == Readiness(
        True, "Running", "2 trials planned on 2 GPUs, pods created"
    )
    for st in rec.trials.values():
        st.phase = "Completed"
    assert shaped(trialgroup_readiness(rec, plans)) == Readiness(True, "Succeeded", "all 2 trials ended")


def test_deployment_ready_needs_every_wanted_replica_placed_with_its_worker() -> None:
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": meta("m"),
        "spec": {"template": TEMPLATE, "model": {"name": "r"}, "slo": {"latencyMs": 100}, "replicas": 2},
    }
    rec = serving.record_from_body(body)
    rec.gpus = [["n1/0"]]
    short = shaped(deployment_readiness(rec, 2, []))
    assert (short.ok, short.reason, short.message) == (
        False,
        "WaitingForGPUs",
        "1 of 2 replicas placed: waiting for free GPUs",
    )
    rec.gpus.append(["n2/0"])
    plans = rec.pod_plans()
    missing = shaped(deployment_readiness(rec, 2, plans[1:]))
    assert (missing.ok, missing.reason) == (False, "PodsNotCreated") and "replica(s) 1 " in missing.message
    assert shaped(deployment_readiness(rec, 2, [])) == Readiness(
        True, "Serving", "2 replicas on 2 GPUs; gateway and workers created"
    )
