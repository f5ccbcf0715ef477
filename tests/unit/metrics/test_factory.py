"""tessera.metrics and tessera_agent.metrics_factory expose exactly what the catalogue says."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import Component, MetricType
from tessera.metrics import ComponentMetrics
from tessera_agent.metrics_factory import AgentMetrics


def _exposed(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    """family name as scraped -> (type, label names seen), after one observation of every metric."""
    families = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        labels = {k for sample in family.samples for k in sample.labels if k != "le"}
        families[family.name] = (family.type, labels)
    return families


def _touch_all(registry: CollectorRegistry, component: Component) -> None:
    """Observe every metric once so labelled families produce samples."""
    metrics = ComponentMetrics.create(component, registry)
    for spec in catalog.for_component(component):
        labels = {label: "x" for label in spec.labels}
        if spec.type is MetricType.COUNTER:
            metric = metrics.counter(spec.name)
            (metric.labels(**labels) if labels else metric).inc()
        elif spec.type is MetricType.GAUGE:
            gauge = metrics.gauge(spec.name)
            (gauge.labels(**labels) if labels else gauge).set(1)
        else:
            hist = metrics.histogram(spec.name)
            (hist.labels(**labels) if labels else hist).observe(1)


@pytest.mark.parametrize("component", [c for c in Component if c is not Component.AGENT])
def test_component_exposes_catalogue_names_types_and_labels(component: Component) -> None:
    registry = CollectorRegistry()
    _touch_all(registry, component)
    exposed = _exposed(registry)
    for spec in catalog.for_component(component):
        # The text parser reports counters under their stem (without `_total`).
        family = spec.name.removesuffix("_total") if spec.type is MetricType.COUNTER else spec.name
        assert family in exposed, f"{spec.name} not exposed by {component}"
        kind, labels = exposed[family]
        assert kind == spec.type.value
        assert labels == set(spec.labels), spec.name
    text = generate_latest(registry).decode()
    for spec in catalog.for_component(component):
        for series in spec.series_names:
            assert f"\n{series}" in text or text.startswith(series), series


def test_build_info_names_the_component() -> None:
    registry = CollectorRegistry()
    ComponentMetrics.create("gateway", registry)
    assert registry.get_sample_value("tessera_build_info", {"component": "gateway", "version": "0.1.0"}) == 1


def test_lookups_fail_with_actionable_messages() -> None:
    metrics = ComponentMetrics.create(Component.EXTENDER, CollectorRegistry())
    with pytest.raises(KeyError, match="exported by agent, not by extender"):
        metrics.gauge("tessera_gpu_utilization_ratio")
    with pytest.raises(TypeError, match="is a Counter, not a Gauge"):
        metrics.gauge("tessera_extender_requests_total")
    with pytest.raises(KeyError, match="not in the Tessera metric catalogue"):
        metrics.counter("tessera_made_up_total")
    with pytest.raises(ValueError, match="unknown component 'kubelet'"):
        ComponentMetrics.create("kubelet", CollectorRegistry())


def test_agent_factory_matches_the_shared_factory() -> None:
    agent = AgentMetrics(CollectorRegistry())
    shared = CollectorRegistry()
    ComponentMetrics.create(Component.AGENT, shared)
    # Same families with the same types and label sets, built by the two factories.
    shared_families = {
        f.name: f.type for f in text_string_to_metric_families(generate_latest(shared).decode())
    }
    agent_families = {
        f.name: f.type for f in text_string_to_metric_families(generate_latest(agent.registry).decode())
    }
    assert agent_families == shared_families
    agent.gauge("tessera_lane_memory_limit_bytes").labels(
        node="n1", gpu="0", lane="l1", namespace="ml", pod="p"
    ).set(2**30)
    assert (
        agent.registry.get_sample_value(
            "tessera_lane_memory_limit_bytes",
            {"node": "n1", "gpu": "0", "lane": "l1", "namespace": "ml", "pod": "p"},
        )
        == 2**30
    )
    with pytest.raises(KeyError, match="not an agent gauge"):
        agent.gauge("tessera_app_rho")
    with pytest.raises(KeyError, match="not an agent counter"):
        agent.counter("tessera_gpu_healthy")
