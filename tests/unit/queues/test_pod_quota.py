"""CPU and memory quotas of a queue (`maxCPU`, `maxMemory`): a pod's requests, the gate holding back a group
that would pass them, and how many more pods of an App fit (controller/quotas.py)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError
from tessera.api import contract
from tessera.api.queue import QueueSpec
from tessera.controller.apps import record_from_body
from tessera.controller.arbiter import Arbiter
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context
from tessera.controller.gate import Group, decide, fifo
from tessera.controller.metrics import operator_metrics
from tessera.controller.quotas import Requests, pod_requests, pods_that_fit, quota_block
from tessera.controller.view import ClusterView

from tests.unit.controller.test_leases import body, job
from tests.unit.queues.test_queue_gate import book, pod, queue_of

GI = 1 << 30
T0 = 1_700_000_000.0


def cpu_pod(name: str, cpu: str, memory: str = "1Gi", **kw: Any) -> dict[str, Any]:
    body = pod(name, **kw)
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    return body


def test_a_pods_requests_are_what_the_scheduler_reserves() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "2", "memory": "512Mi"}}},  # request from limit
            {"name": "c"},
        ],
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}],
    }
    # CPU: the init container's 4 beats the containers' 2.5; memory: the containers' 1.5Gi.
    assert pod_requests(spec) == Requests(Decimal("4"), Decimal(GI + GI // 2))
    assert pod_requests({"containers": [{"name": "x"}]}) == Requests()


def test_a_group_over_the_queues_cpu_waits_and_smaller_ones_behind_it_go() -> None:
    spec = QueueSpec.model_validate({"maxCPU": "8", "maxMemory": "64Gi"})
    b = book(
        cpu_pod("big", "6", created="2026-01-01T00:00:00Z"),
        cpu_pod("small", "2", created="2026-01-01T00:01:00Z"),
        cpu_pod("more", "1", created="2026-01-01T00:02:00Z"),
    )
    held = Requests(Decimal(3))  # the queue's Apps' pods request 3 CPUs

    def quota(g: Group) -> tuple[str, str] | None:
        used = held + b.admitted_requests(queue_of).get("a", Requests())
        return quota_block("a", spec, used, g.waiting_requests, g.key)

    d = decide(fifo(b.groups(), queue_of), lambda q: None, lambda g: 8.0, b.mark_admitted, quota)
    # 3 + 6 > 8: big waits; 3 + 2 fits, then 5 + 1 fits.
    assert [g.key for g in d.admit] == ["Pod/small", "Pod/more"]
    assert [(g.key, r, m) for g, r, m in d.over_quota] == [
        ("Pod/big", "QueueCPUQuota", "Pod/big requests 6 CPU; queue a's pods request 3 CPU of its maxCPU 8")
    ]
    assert b.admitted_requests(queue_of) == {"a": Requests(Decimal(3), Decimal(2 * GI))}


def test_memory_is_checked_the_same_way() -> None:
    spec = QueueSpec.model_validate({"maxMemory": "4Gi"})
    got = quota_block(
        "a", spec, Requests(memory=Decimal(3 * GI)), Requests(memory=Decimal(2 * GI)), "Job sweep"
    )
    assert got == (
        "QueueMemoryQuota",
        "Job sweep requests 2Gi memory; queue a's pods request 3Gi memory of its maxMemory 4Gi",
    )
    assert (
        quota_block("a", spec, Requests(memory=Decimal(2 * GI)), Requests(memory=Decimal(2 * GI)), "x")
        is None
    )
    assert quota_block("a", QueueSpec(), Requests(Decimal(10**6)), Requests(Decimal(10**6)), "x") is None


def test_pods_that_fit_takes_the_tighter_of_cpu_and_memory() -> None:
    spec = QueueSpec.model_validate({"maxCPU": "16", "maxMemory": "40Gi"})
    used = Requests(Decimal(4), Decimal(8 * GI))
    assert pods_that_fit(spec, used, Requests(Decimal(4), Decimal(4 * GI))) == (3, "QueueCPUQuota")
    assert pods_that_fit(spec, used, Requests(Decimal(1), Decimal(16 * GI))) == (2, "QueueMemoryQuota")
    assert pods_that_fit(spec, Requests(Decimal(20)), Requests(Decimal(1))) == (0, "QueueCPUQuota")
    assert pods_that_fit(QueueSpec(), used, Requests(Decimal(4)))[1] == ""  # no quota: no bound


def test_quantities_are_validated_like_the_crd() -> None:
    for ok in ("64", "500m", "256Gi", "1.5", "2e3"):
        QueueSpec.model_validate({"maxCPU": ok, "maxMemory": ok})
    for bad in ("-1", "1Gb", "abc", ""):
        with pytest.raises(ValidationError):
            QueueSpec.model_validate({"maxCPU": bad})
    with pytest.raises(ValidationError):
        QueueSpec.model_validate({"maxCPU": 64})  # a number, not a string: quote it, as the CRD wants
    with pytest.raises(ValidationError):
        QueueSpec.model_validate({"maxGPUsByModel": {"A100": -1}})


def test_an_app_is_offered_only_the_gpus_whose_pods_fit_its_queues_cpu() -> None:
    view = ClusterView()
    inv = [{"uuid": f"n0-{i}", "index": i, "memoryMiB": 16384} for i in range(8)]
    view.on_node({"metadata": {"name": "n0", "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}})
    arbiter = Arbiter(
        Context(OperatorConfig(clock=lambda: T0), view, None, operator_metrics(), lambda *_: None)  # type: ignore[arg-type]
    )
    arbiter.queues.set_queue("a", QueueSpec.model_validate({"maxCPU": "10"}))
    arbiter.queues.set_namespace("ml", {contract.LABEL_QUEUE: "a"})
    arbiter.pod_requests = lambda: {"a": Requests(Decimal(1))}  # a pod admitted through the gate
    cluster = view.cluster()
    recs = []
    for i, (cpu, jobs) in enumerate((("3", 1), ("2", 4), ("1", 2))):
        raw = body([job(f"j{k}", 1) for k in range(jobs)])
        raw["metadata"] = {"name": f"a{i}", "namespace": "ml", "uid": f"u-{i}"}
        raw["spec"]["template"] = {
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
        }
        recs.append(record_from_body(raw, T0 + i))  # a0 oldest
        arbiter.upsert(recs[-1])
    recs[0].grant([cluster.gpu_ids[0]], T0 + 600, "auction", cluster)  # a0's one pod requests 3
    states = [arbiter.queued_state(r, T0) for r in recs]
    got = {s.app_id: s.demand_max for s in arbiter._within_pod_quotas(states, recs)}
    # 1 + 3 = 4 of 10 CPUs requested: a1 (2 CPUs a pod) is offered 3 of its 4 GPUs, which set aside the
    # other 6, so a2 (1 CPU a pod) is offered none.
    assert got == {"ml/a0": 1, "ml/a1": 3, "ml/a2": 0}
    assert arbiter.quota_waits[("ml", "a1")] == (
        "QueueCPUQuota",
        "queue a's pods request 4 CPU of its maxCPU 10; a pod of App a1 requests 2 CPU: offered 3 more GPU(s) "
        "of the 4 it waits for",
    )
    assert arbiter.quota_waits[("ml", "a2")][0] == "QueueCPUQuota"
