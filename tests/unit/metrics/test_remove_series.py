"""ComponentMetrics.remove_series: a deleted object's series leave the exposition, others' stay."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from tessera.metrics import ComponentMetrics


def _lines(m: ComponentMetrics, needle: str) -> list[str]:
    return [line for line in generate_latest(m.registry).decode().splitlines() if needle in line]


def test_removes_every_series_of_one_object_across_gauges_counters_and_histograms() -> None:
    m = ComponentMetrics.create("operator", CollectorRegistry())
    for app in ("a", "b"):
        m.gauge("tessera_app_rho").labels(namespace="ml", app=app).set(1.5)
        for change in ("granted", "expired"):
            m.counter("tessera_lease_changes_total").labels(namespace="ml", app=app, change=change).inc()
    m.gauge("tessera_app_rho").labels(namespace="other", app="a").set(2)
    m.gauge("tessera_namespace_gpus").labels(namespace="ml", workload="training").set(3)

    assert m.remove_series(namespace="ml", app="a") == 3  # rho + two lease-change series
    assert not _lines(m, 'app="a",namespace="ml"')
    assert not [line for line in _lines(m, 'app="a"') if 'namespace="ml"' in line]
    assert _lines(m, 'tessera_app_rho{app="b",namespace="ml"}')
    assert _lines(m, 'tessera_app_rho{app="a",namespace="other"}')
    # A metric without an `app` label is not touched by a removal keyed on it.
    assert _lines(m, 'tessera_namespace_gpus{namespace="ml",workload="training"}')
    assert m.remove_series(namespace="ml", app="a") == 0


def test_histogram_series_are_removed_with_their_buckets() -> None:
    m = ComponentMetrics.create("gateway", CollectorRegistry())
    h = m.histogram("tessera_serving_batch_size")
    h.labels(namespace="ml", modeldeployment="bert").observe(4)
    h.labels(namespace="ml", modeldeployment="gpt").observe(4)
    assert m.remove_series(namespace="ml", modeldeployment="bert") == 1
    assert not _lines(m, 'modeldeployment="bert"')
    assert _lines(m, 'tessera_serving_batch_size_count{modeldeployment="gpt"')
