"""Model behaviour: wire names, defaults from the papers, errors with field paths, status round trips."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tessera.api import ManifestError, parse_app, parse_modeldeployment, parse_resource, parse_trialgroup
from tessera.api.app import AppStatus, Lease
from tessera.api.crd import openapi_schema
from tessera.api.modeldeployment import ModelDeploymentSpec
from tessera.api.resources import KINDS, manifest_errors
from tessera.api.trialgroup import FluidSettings

from .apiserver import cel_errors, openapi_errors
from .conftest import EXAMPLES, load


def test_parse_helpers_return_typed_resources() -> None:
    app = parse_app(load(EXAMPLES / "app.yaml"))
    assert app.spec.jobs[0].max_gpus == 4
    assert app.spec.tuning.successive_halving is not None
    assert app.spec.tuning.successive_halving.iters_per_phase == [8, 16, 36]
    tg = parse_trialgroup(load(EXAMPLES / "trialgroup.yaml"))
    assert len(tg.spec.trials) == 9 and tg.spec.trials[0].config["lr"] == 0.1
    md = parse_modeldeployment(load(EXAMPLES / "modeldeployment.yaml"))
    assert md.spec.slo.p99_multiplier == 3.0
    with pytest.raises(ManifestError, match="expected App"):
        parse_app(load(EXAMPLES / "trialgroup.yaml"))


def test_paper_defaults() -> None:
    job = parse_app(load(EXAMPLES / "app.yaml")).spec.jobs[0]
    # Themis footnote 3 crude placement slowdowns.
    assert (job.placement_sensitivity.machine, job.placement_sensitivity.cross_machine) == (1.0, 1.1)
    assert job.placement_sensitivity.cross_rack == 1.3
    spec = parse_modeldeployment(load(EXAMPLES / "modeldeployment-static.yaml")).spec
    # Orloj §5 defaults.
    assert spec.scheduler.anticipated_delay_rate_per_ms == 1e-4
    assert spec.profiler.sample_rate == 0.02 and spec.profiler.window_seconds == 600
    assert spec.scheduler.policy == "auto" and spec.frontend.app_id_header == "x-tessera-app"
    assert ModelDeploymentSpec.model_fields["batching"].default_factory is not None
    assert spec.gpu.workload_class == "latency-critical"
    assert FluidSettings().enable_intra_gpu and FluidSettings().enable_inter_gpu


def test_wire_names_keep_units_and_acronyms() -> None:
    wire = parse_app(load(EXAMPLES / "app.yaml")).spec.to_wire()
    assert {"maxGPUs", "iterTimeSerialSeconds", "checkpointSeconds"} <= set(wire["jobs"][0])
    assert {"gpuMemoryMiB", "persistentMiB", "ephemeralPeakMiB"} <= set(wire["gpu"])
    assert "budgetGPUSeconds" in wire["tuning"]["successiveHalving"]


def test_unknown_kind_and_non_mapping() -> None:
    assert manifest_errors({"kind": "Pod"}) == [
        ("kind", "must be one of App, ModelDeployment, Queue, TrialGroup, got 'Pod'")
    ]
    assert manifest_errors([1, 2])[0][1].startswith("a manifest must be a mapping")
    with pytest.raises(ManifestError) as exc:
        parse_resource({"apiVersion": "tessera.io/v1alpha1", "kind": "App", "metadata": {"name": "x"}})
    assert exc.value.errors == [("spec", "required field is missing")]


def _set(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


# (example, where to change, new value, expected error path)
MUTATIONS = [
    ("app.yaml", ["spec", "jobs", 2, "iterTotal"], 0, "spec.jobs[2].iterTotal"),
    ("app.yaml", ["spec", "jobs", 0, "iterTimeSerialSeconds"], 0, "spec.jobs[0].iterTimeSerialSeconds"),
    ("app.yaml", ["spec", "jobs", 0, "name"], "Bad_Name", "spec.jobs[0].name"),
    ("app.yaml", ["spec", "jobs", 1, "name"], "lr-0-1", "spec.jobs"),
    (
        "app.yaml",
        ["spec", "jobs", 3, "placementSensitivity", "crossMachine"],
        2.0,
        "spec.jobs[3].placementSensitivity",
    ),
    ("app.yaml", ["spec", "tuning", "mode"], "random", "spec.tuning.mode"),
    ("app.yaml", ["spec", "gpu", "ephemeralPeakMiB"], 40000, "spec.gpu.ephemeralPeakMiB"),
    ("app.yaml", ["spec", "jobs", 0, "predictedStopIteration"], 61, "spec.jobs[0].predictedStopIteration"),
    ("app.yaml", ["spec", "template", "spec", "containers"], [], "spec.template.spec.containers"),
    ("trialgroup.yaml", ["spec", "trials", 0, "budgetIterations"], 0, "spec.trials[0].budgetIterations"),
    ("trialgroup.yaml", ["spec", "gpu", "lane", "computePercent"], 101, "spec.gpu.lane.computePercent"),
    ("trialgroup.yaml", ["spec", "gpu", "lane", "memoryMiB"], 20000, "spec.gpu.lane.memoryMiB"),
    (
        "trialgroup.yaml",
        ["spec", "fluid", "packingBenefitThreshold"],
        1.0,
        "spec.fluid.packingBenefitThreshold",
    ),
    ("trialgroup.yaml", ["spec", "algorithm", "name"], "bayes", "spec.algorithm.name"),
    (
        "modeldeployment.yaml",
        ["spec", "batching", "supportedBatchSizes"],
        [2, 4],
        "spec.batching.supportedBatchSizes",
    ),
    (
        "modeldeployment.yaml",
        ["spec", "batching", "supportedBatchSizes"],
        [1, 1, 2],
        "spec.batching.supportedBatchSizes",
    ),
    (
        "modeldeployment.yaml",
        ["spec", "batching", "latencyModel"],
        {"type": "linear"},
        "spec.batching.latencyModel",
    ),
    ("modeldeployment.yaml", ["spec", "model", "parameters"], "4.06e8", "spec.model.parameters"),
    ("modeldeployment.yaml", ["spec", "model", "dynamic"], "yes", "spec.model.dynamic"),
    ("modeldeployment.yaml", ["spec", "replicas"], 65, "spec.replicas"),
    ("modeldeployment.yaml", ["spec", "memory", "staticMiB"], 40000, "spec.memory"),
    (
        "modeldeployment.yaml",
        ["spec", "scheduler", "dropEstimator"],
        "quantile:2",
        "spec.scheduler.dropEstimator",
    ),
    ("modeldeployment.yaml", ["spec", "applications", 1, "id"], "news", "spec.applications"),
    ("modeldeployment.yaml", ["spec", "applications", 0, "prior"], {}, "spec.applications[0].prior"),
    (
        "modeldeployment-static.yaml",
        ["spec", "batching", "latencyModel", "perBatchSizeMs"],
        [5.4, 5.7],
        "spec.batching.latencyModel.perBatchSizeMs",
    ),
    (
        "modeldeployment-static.yaml",
        ["spec", "batching", "latencyModel", "perBatchSizeMs"],
        [5.4, 5.7, 5.0, 7.0, 9.0, 13.0],
        "spec.batching.latencyModel.perBatchSizeMs",
    ),
    (
        "modeldeployment-static.yaml",
        ["spec", "latencyProfiles", 0, "points", 1, "batchSize"],
        1,
        "spec.latencyProfiles[0].points",
    ),
    ("modeldeployment-static.yaml", ["spec", "placement", "minGPUs"], 65, "spec.placement.minGPUs"),
]


@pytest.mark.parametrize(("example", "where", "value", "path"), MUTATIONS, ids=lambda v: str(v)[:40])
def test_models_and_api_server_agree_on_broken_manifests(
    example: str, where: list[Any], value: Any, path: str
) -> None:
    doc = _set(load(EXAMPLES / example), where, value)
    model_paths = {p for p, _ in manifest_errors(doc)}
    assert path in model_paths
    schema = openapi_schema(KINDS[doc["kind"]])
    server_paths = {p for p, _ in openapi_errors(doc, schema)} | {p for p, _ in cel_errors(doc, schema)}
    assert path in server_paths


def test_status_round_trips_through_the_wire() -> None:
    status = AppStatus(
        phase="Running",
        gpus=3,
        rho=1.25,
        leases=[Lease(node="n1", gpu_indices=[0, 1], expires_at="2024-05-01T10:10:00Z", source="auction")],  # type: ignore[arg-type]
    )
    wire = status.to_wire()
    assert (
        wire["leases"][0]["gpuIndices"] == [0, 1] and wire["leases"][0]["expiresAt"] == "2024-05-01T10:10:00Z"
    )
    assert "rhoFinal" not in wire  # unset optionals are left out, so a merge patch does not clear them
    assert AppStatus.model_validate(wire) == status
    # What the operator writes must satisfy the CRD's status schema.
    doc = load(EXAMPLES / "app.yaml") | {"status": wire}
    assert openapi_errors(doc, openapi_schema(KINDS["App"])) == []
