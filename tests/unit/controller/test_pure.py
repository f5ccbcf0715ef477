"""Pure controller pieces: the multi-job finish-time rule, estimators, replica decisions, pod naming,
progress parsing, conditions and the TrialGroup pool/planning record (no Kubernetes)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from tessera.api import contract
from tessera.api.resources import parse_modeldeployment
from tessera.controller.conditions import invalid_status
from tessera.controller.estimator import JobSetEstimator, JobWork
from tessera.controller.pods import PodPlan
from tessera.controller.serving import desired_replicas, linear_fit, replica_capacity_rps
from tessera.controller.trialgroups import parse_pool, record_from_body
from tessera.controller.view import ClusterView, parse_progress
from tessera.policy.themis.apps import JobLoad, last_job_finish_time

TEMPLATE = {"spec": {"containers": [{"name": "c", "image": "x"}]}}


def test_last_job_rule_by_hand() -> None:
    # Two jobs of 100 and 300 serial GPU-s, d = 2 each, on 2 GPUs: total 400 / 2 = 200 s; the big job
    # alone needs 300 / 2 = 150 s; so 200 s. On 8 GPUs: total 400 / min(8, 4) = 100 s < 150 s → 150 s.
    jobs = [JobLoad(100, 2), JobLoad(300, 2)]
    assert last_job_finish_time(jobs, 2) == 200.0
    assert last_job_finish_time(jobs, 8) == 150.0
    assert last_job_finish_time(jobs, 8, slowdown=1.5) == 225.0
    assert last_job_finish_time(jobs, 0) == math.inf
    assert last_job_finish_time([JobLoad(0, 1)], 0) == 0.0
    with pytest.raises(ValueError, match="maxGPUs"):
        JobLoad(1, 0)


def test_estimator_one_job_is_eq1_and_several_use_the_rule() -> None:
    one = JobSetEstimator((JobWork("a", 100, 2.0, 4),))
    assert one.remaining_time(2, 1.0) == 100.0  # 100 iters x 2 s / 2 GPUs
    two = JobSetEstimator((JobWork("a", 50, 2.0, 2), JobWork("b", 150, 2.0, 2)))
    assert two.remaining_time(2, 1.0) == 200.0


def md(rps: float, **extra: object) -> object:
    return parse_modeldeployment(
        {
            "apiVersion": contract.API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {
                "template": TEMPLATE,
                "model": {"name": "r"},
                "slo": {"latencyMs": 100},
                "traffic": {"expectedRps": rps},
                "batching": {
                    "supportedBatchSizes": [1, 2, 4, 8],
                    "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15, 25, 45]},
                },
                **extra,
            },
        }
    ).spec


def test_replicas_are_load_proportional_and_follow_symphony_advice() -> None:
    spec = md(300)
    assert replica_capacity_rps(spec) == pytest.approx(8000 / 45)
    assert desired_replicas(spec, {}, 0).replicas == 2
    assert desired_replicas(md(600), {}, 2).replicas == 4
    # Observed: goodput 150 rps at 50 % attainment → 300 rps offered; bad rate 0.5 on 2 GPUs → +2.
    d = desired_replicas(spec, {"goodputRps": 150, "sloAttainmentPercent": 50, "gpuIdlePercent": 0}, 2)
    assert d.replicas == 4 and "advice" in d.reason
    assert desired_replicas(md(10_000, placement={"maxGPUs": 3}), {}, 0).replicas == 3
    alpha, beta = linear_fit([(1, 10.0), (2, 15.0), (4, 25.0), (8, 45.0)])
    assert alpha == pytest.approx(0.005) and beta == pytest.approx(0.005)


def test_pod_names_are_stable_and_change_with_the_plan() -> None:
    a = PodPlan("n1", (0,), {}, {"X": "1"}, "trial", base="tg-a-0")
    assert a.name == PodPlan("n1", (0,), {}, {"X": "1"}, "trial", base="tg-a-0").name
    assert a.name != PodPlan("n1", (0, 1), {}, {"X": "1"}, "trial", base="tg-a-0").name
    assert len(PodPlan("n1", (0,), {}, {}, "trial", base="x" * 100).name) <= 63


def test_progress_and_view() -> None:
    assert parse_progress('{"iterations": 5}') == 5
    assert parse_progress("nope") is None and parse_progress('{"iterations": -1}') is None
    view = ClusterView()
    view.on_node(
        {
            "metadata": {
                "name": "n1",
                "annotations": {contract.ANN_NODE_GPUS: '[{"uuid": "u", "index": 0, "memoryMiB": 100}]'},
            }
        }
    )
    view.on_pod(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "annotations": {contract.ANN_PLACEMENT: '{"node": "n1", "gpuIndices": [0]}'},
            },
            "status": {"phase": "Running"},
        }
    )
    assert view.used_by_pods() == {"n1/0"} and list(view.cluster().gpu_ids) == ["n1/0"]


def test_invalid_status_names_every_field() -> None:
    status, msg = invalid_status([("spec.a", "bad"), ("spec.b", "worse")])
    assert status["phase"] == "Failed" and msg == "spec.a: bad; spec.b: worse"
    assert status["conditions"][0]["type"] == "Valid" and status["conditions"][0]["status"] == "False"


def test_trialgroup_record_recovers_pool_and_widths() -> None:
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": "TrialGroup",
        "metadata": {
            "name": "tg",
            "namespace": "ns",
            "uid": "u",
            "annotations": {contract.ANN_GPU_POOL: '["n1/0", "n1/1"]'},
        },
        "spec": {"template": TEMPLATE, "trials": [{"name": "a", "budgetIterations": 10}]},
        "status": {
            "trials": [
                {
                    "name": "a",
                    "phase": "Running",
                    "iterationsDone": 4,
                    "width": 2.0,
                    "placement": {"node": "n1"},
                }
            ]
        },
    }
    rec = record_from_body(body)
    assert rec.pool == ["n1/0", "n1/1"] and rec.trials["a"].width == Fraction(2)
    assert rec.h1(rec.spec.trials[0]) == 6.0
    assert parse_pool("[1, 2]") == [] and parse_pool(None) == []


def test_observed_load_comes_from_the_gateway_report_only() -> None:
    md = parse_modeldeployment(
        {
            "apiVersion": contract.API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {
                "template": TEMPLATE,
                "model": {"name": "r", "dynamic": False},
                "slo": {"latencyMs": 100},
                "traffic": {"expectedRps": 300},
                "batching": {
                    "supportedBatchSizes": [1, 2, 4, 8],
                    "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15, 25, 45]},
                },
                "gpu": {"lane": {"memoryMiB": 4096, "computePercent": 50}},
            },
        }
    )
    planned = desired_replicas(md.spec, {}, 0)
    assert not planned.observed and planned.load_rps == 300 and planned.replicas == 2
    # goodput 450 rps at 90 % attainment: 500 rps offered → ⌈500 / 177.8⌉ = 3 replicas
    seen = desired_replicas(md.spec, {"goodputRps": 450.0, "sloAttainmentPercent": 90.0}, 0)
    assert seen.observed and seen.load_rps == pytest.approx(500.0) and seen.replicas == 3


def test_progress_loss_is_the_trial_result() -> None:
    from tessera.controller.view import parse_progress_loss

    assert parse_progress_loss('{"iterations": 5, "loss": 0.25}') == 0.25
    assert parse_progress_loss('{"iterations": 5}') is None and parse_progress_loss("nope") is None
    assert parse_progress_loss('{"iterations": 5, "loss": "x"}') is None
