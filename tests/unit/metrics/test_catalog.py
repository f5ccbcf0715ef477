"""The metric catalogue: names follow Prometheus conventions and cover issue 10's list."""

from __future__ import annotations

import pytest
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import CATALOG, Component, MetricSpec, MetricType

# Issue 10 "Build": what the metrics must show, and the catalogue entry that shows it.
ISSUE_10_CONCEPTS = {
    "rho per app": ("tessera_app_rho", ("namespace", "app")),
    "T_shared": ("tessera_app_t_shared_seconds", ("namespace", "app")),
    "T_independent": ("tessera_app_t_independent_seconds", ("namespace", "app")),
    "GPUs held per app": ("tessera_app_gpus", ("namespace", "app")),
    "GPUs held per namespace": ("tessera_namespace_gpus", ("namespace",)),
    "lease changes": ("tessera_lease_changes_total", ("namespace", "app")),
    "auction duration": ("tessera_auction_duration_seconds", ()),
    "Fluid widths": ("tessera_trial_width", ("namespace", "trialgroup", "trial")),
    "trial progress": ("tessera_trial_progress_ratio", ("namespace", "trialgroup", "trial")),
    "lane memory used": ("tessera_lane_memory_used_bytes", ("node", "gpu", "lane")),
    "lane memory limit": ("tessera_lane_memory_limit_bytes", ("node", "gpu", "lane")),
    "GPU utilisation": ("tessera_gpu_utilization_ratio", ("node", "gpu")),
    "lane utilisation": ("tessera_lane_utilization_ratio", ("node", "gpu", "lane")),
    "queue lengths": ("tessera_serving_queue_length", ("namespace", "modeldeployment")),
    "pending pods": ("tessera_pending_pods", ("namespace",)),
    "batch sizes": ("tessera_serving_batch_size", ("namespace", "modeldeployment")),
    "SLO hits and misses": ("tessera_serving_requests_total", ("namespace", "modeldeployment", "outcome")),
    "extender latency": ("tessera_extender_request_duration_seconds", ("verb",)),
    "replicas": ("tessera_serving_replicas", ("namespace", "modeldeployment")),
}


@pytest.mark.parametrize("concept", sorted(ISSUE_10_CONCEPTS))
def test_issue_concept_has_a_metric_with_design_labels(concept: str) -> None:
    name, labels = ISSUE_10_CONCEPTS[concept]
    spec = catalog.get(name)
    assert set(labels) <= set(spec.labels), f"{name} lacks labels {set(labels) - set(spec.labels)}"


def test_names_are_unique_and_prefixed() -> None:
    names = [spec.name for spec in CATALOG]
    assert len(names) == len(set(names))
    assert all(n.startswith("tessera_") for n in names)


def test_every_component_exports_build_info_and_something_else() -> None:
    for component in Component:
        names = {spec.name for spec in catalog.for_component(component)}
        assert "tessera_build_info" in names
        assert len(names) > 1, f"{component} exports nothing but build info"


def test_workload_objects_use_design_label_names() -> None:
    # DESIGN.md: series about a custom resource are labelled namespace + app|trialgroup|modeldeployment.
    for spec in CATALOG:
        for kind in ("app", "trialgroup", "modeldeployment"):
            if spec.name.startswith(f"tessera_{kind}_") or (
                kind == "modeldeployment" and "_serving_" in spec.name
            ):
                assert {"namespace", kind} <= set(spec.labels), spec.name


def test_histogram_series_names_resolve_to_their_family() -> None:
    assert catalog.get("tessera_serving_batch_size_bucket").name == "tessera_serving_batch_size"
    assert catalog.base_name("tessera_serving_batch_size_count") == "tessera_serving_batch_size"
    # A gauge has no derived series.
    with pytest.raises(KeyError, match="not in the Tessera metric catalogue"):
        catalog.get("tessera_app_rho_bucket")
    assert "tessera_auction_duration_seconds_sum" in catalog.all_series_names()


def test_unknown_names_and_components_are_rejected_clearly() -> None:
    with pytest.raises(KeyError, match="tessera_nope"):
        catalog.get("tessera_nope")
    with pytest.raises(ValueError, match="expected one of: operator"):
        catalog.for_component("scheduler")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "gpu_util"}, "must match"),
        ({"name": "tessera_xy_bucket"}, "must not end in"),
        ({"name": "tessera_xy", "type": MetricType.COUNTER}, "end in '_total'"),
        ({"name": "tessera_xy_total"}, "end in '_total'"),
        ({"labels": ("node", "node")}, "repeats a label"),
        ({"labels": ("le",)}, "not allowed"),
        ({"labels": ("Node",)}, "not allowed"),
        ({"components": frozenset()}, "at least one"),
        ({"help": " "}, "help text"),
        ({"buckets": (1.0, 2.0)}, "only histograms"),
        ({"type": MetricType.HISTOGRAM, "buckets": (2.0, 1.0)}, "strictly increasing"),
    ],
)
def test_metric_spec_rejects_malformed_entries(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "name": "tessera_xy",
        "type": MetricType.GAUGE,
        "help": "h",
        "labels": ("node",),
        "components": frozenset({Component.AGENT}),
    }
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        MetricSpec(**base)  # type: ignore[arg-type]
