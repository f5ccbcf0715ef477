"""Grafana dashboards: schema-shaped JSON, a datasource variable, and only catalogue metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tessera.api import metrics_catalog as catalog

from .promql_names import PromQLSyntaxError, dashboard_exprs, load_dashboards, metric_names

DASHBOARDS = Path(__file__).resolve().parents[3] / "charts" / "tessera" / "dashboards"
ALL = load_dashboards(DASHBOARDS)
REQUIRED = {"fairness.json", "utilisation.json", "tuning.json", "serving.json", "queues.json"}


def test_the_four_dashboards_of_issue_10_exist() -> None:
    assert set(ALL) >= REQUIRED


@pytest.mark.parametrize("name", sorted(ALL))
def test_dashboard_is_grafana_shaped(name: str) -> None:
    dash = ALL[name]
    assert dash["uid"].startswith("tessera-") and len(dash["uid"]) <= 40
    assert dash["title"].startswith("Tessera / ")
    assert isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dash["panels"]:
        if panel["type"] == "row":  # a row groups (and may repeat) the panels below it; it queries nothing
            assert panel.get("repeat") is None or panel["repeat"] in variables, panel["title"]
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"][
            "w"
        ] <= 24
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].strip()
            assert target["datasource"]["uid"] == "${datasource}"


def _series_in(dash: dict[str, Any]) -> set[str]:
    return {name for _, expr in dashboard_exprs(dash) for name in metric_names(expr)}


@pytest.mark.parametrize("name", sorted(ALL))
def test_dashboard_queries_only_catalogue_metrics(name: str) -> None:
    known = catalog.all_series_names()
    for where, expr in dashboard_exprs(ALL[name]):
        unknown = metric_names(expr) - known
        assert not unknown, f"{name} {where} queries {sorted(unknown)}, which no component exports: {expr}"


def test_fairness_dashboard_shows_rho_max_and_jain() -> None:
    exprs = [e for _, e in dashboard_exprs(ALL["fairness.json"])]
    assert any(e.startswith("max(tessera_app_rho") for e in exprs)
    jain = [e for e in exprs if "count(tessera_app_rho" in e and "^2" in e]
    assert jain, "Jain's index (Σρ)²/(n·Σρ²) missing"


def test_dashboards_together_cover_the_headline_metrics() -> None:
    used = {catalog.base_name(s) for dash in ALL.values() for s in _series_in(dash)}
    for name in (
        "tessera_app_rho",
        "tessera_lane_memory_used_bytes",
        "tessera_gpu_utilization_ratio",
        "tessera_trial_width",
        "tessera_trial_progress_ratio",
        "tessera_serving_requests_total",
        "tessera_serving_request_latency_seconds",
        "tessera_serving_batch_size",
        "tessera_serving_replicas",
    ):
        assert name in used, name


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (namespace, app) (rate(tessera_a_total{outcome="x_total"}[5m]))', {"tessera_a_total"}),
        ("x / on (node, gpu) group_left (uuid) y", {"x", "y"}),
        ("max without (pod) (m) > bool 1 or vector(0)", {"m"}),
        (
            'histogram_quantile(0.9, sum by (le) (rate(h_bucket{ns=~"$namespace"}[$__rate_interval])))',
            {"h_bucket"},
        ),
        ("(sum(r))^2 / (count(r) * sum(r^2))", {"r"}),
        ("a offset 5m unless ignoring (lane) b", {"a", "b"}),
        ("topk(3, c) + Inf", {"c"}),
    ],
)
def test_tokenizer_finds_exactly_the_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_tokenizer_rejects_unbalanced_brackets() -> None:
    with pytest.raises(PromQLSyntaxError, match="unbalanced"):
        metric_names("sum(rate(x[5m])")


def test_queues_dashboard_repeats_a_row_per_queue_over_every_queue_gauge() -> None:
    dash = ALL["queues.json"]
    (row,) = [p for p in dash["panels"] if p["type"] == "row"]
    assert row["repeat"] == "queue"
    names = _series_in(dash)
    assert {s.name for s in catalog.CATALOG if s.name.startswith("tessera_queue_")} <= names
