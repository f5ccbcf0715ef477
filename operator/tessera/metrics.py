"""prometheus-client objects for one component, created from the metric catalogue.

The catalogue (`tessera.api.metrics_catalog`) is the single source of names; this module is the only place
in `tessera` that turns entries into Counter/Gauge/Histogram objects, so a component cannot export a
`tessera_*` series the dashboards do not know about.

    registry = CollectorRegistry()
    metrics = ComponentMetrics.create("gateway", registry)
    metrics.histogram("tessera_serving_batch_size").labels(namespace="ml", modeldeployment="bert").observe(8)
    start_metrics_server(9100, registry=registry)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

import tessera
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import Component, MetricSpec, MetricType

log = logging.getLogger(__name__)

_M = TypeVar("_M", Counter, Gauge, Histogram)


def create_metric(spec: MetricSpec, registry: CollectorRegistry) -> MetricWrapperBase:
    """One prometheus-client object for `spec`, registered in `registry`."""
    if spec.type is MetricType.COUNTER:
        # prometheus-client appends `_total` itself; give it the stem so the exposed name is spec.name.
        return Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=registry)
    if spec.type is MetricType.GAUGE:
        return Gauge(spec.name, spec.help, spec.labels, registry=registry)
    return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)


@dataclass(frozen=True)
class ComponentMetrics:
    """The metric objects of one component, looked up by catalogue name with their type checked."""

    component: Component
    registry: CollectorRegistry
    metrics: Mapping[str, MetricWrapperBase]

    @classmethod
    def create(cls, component: Component | str, registry: CollectorRegistry) -> ComponentMetrics:
        """Register every catalogue metric of `component` in `registry` and set `tessera_build_info`."""
        comp = _component(component)
        objects = {spec.name: create_metric(spec, registry) for spec in catalog.for_component(comp)}
        made = cls(comp, registry, objects)
        made.gauge("tessera_build_info").labels(component=comp.value, version=tessera.__version__).set(1)
        log.debug("registered %d metrics for %s", len(objects), comp.value)
        return made

    def counter(self, name: str) -> Counter:
        return self._typed(name, Counter)

    def gauge(self, name: str) -> Gauge:
        return self._typed(name, Gauge)

    def histogram(self, name: str) -> Histogram:
        return self._typed(name, Histogram)

    def remove_series(self, **labels: str) -> int:
        """Drop every series whose labels include `labels` (e.g. namespace and app of a deleted App) from
        each metric that has all those label names; return how many went. A deleted object's series would
        otherwise be exported with their last value until the process restarts."""
        removed = 0
        for name, metric in self.metrics.items():
            names = catalog.get(name).labels
            if not labels or not set(labels) <= set(names):
                continue
            # The series' label values come from the metric's own samples (Histograms add `le`, Counters
            # a `_created` sample: only the metric's label names form the key `remove` takes).
            keys = {
                tuple(sample.labels[n] for n in names)
                for family in metric.collect()
                for sample in family.samples
                if all(sample.labels.get(k) == v for k, v in labels.items())
            }
            for key in keys:
                metric.remove(*key)
            removed += len(keys)
        return removed

    def _typed(self, name: str, kind: type[_M]) -> _M:
        metric = self.metrics.get(name)
        if metric is None:
            spec = catalog.get(name)  # raises KeyError naming the catalogue for an unknown name
            owners = ", ".join(sorted(c.value for c in spec.components))
            raise KeyError(f"{name!r} is exported by {owners}, not by {self.component.value}")
        if not isinstance(metric, kind):
            raise TypeError(f"{name!r} is a {type(metric).__name__}, not a {kind.__name__}")
        return metric


def _component(value: Component | str) -> Component:
    try:
        return Component(value)
    except ValueError:
        known = ", ".join(c.value for c in Component)
        raise ValueError(f"unknown component {value!r}; expected one of: {known}") from None


def start_metrics_server(port: int, addr: str = "0.0.0.0", *, registry: CollectorRegistry) -> None:
    """Serve `registry` at http://addr:port/metrics in a daemon thread (prometheus-client's server)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics port {port} is outside 0..65535")
    start_http_server(port, addr=addr, registry=registry)
    log.info("metrics on http://%s:%d/metrics", addr, port)


TABLE_BEGIN = "<!-- metrics-table:begin (generated: python -m tessera.metrics docs/operations.md) -->"
TABLE_END = "<!-- metrics-table:end -->"


def markdown_table() -> str:
    """The metric reference of docs/operations.md, generated from the catalogue."""
    rows = [
        "| Metric | Type | Labels | Exported by | Meaning |",
        "|---|---|---|---|---|",
    ]
    for spec in catalog.CATALOG:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
        owners = ", ".join(c.value for c in Component if c in spec.components)
        meaning = spec.help.replace("|", "\\|")
        rows.append(f"| `{spec.name}` | {spec.type.value} | {labels} | {owners} | {meaning} |")
    return "\n".join(rows) + "\n"


def with_table(document: str) -> str:
    """`document` with the text between the table markers replaced by the current table."""
    start, end = document.find(TABLE_BEGIN), document.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"document lacks the markers {TABLE_BEGIN!r} ... {TABLE_END!r}")
    return document[: start + len(TABLE_BEGIN)] + "\n" + markdown_table() + document[end:]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the metric table in the given markdown files."""
    import sys
    from pathlib import Path

    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m tessera.metrics FILE.md ...", file=sys.stderr)
        return 2
    for path in map(Path, paths):
        path.write_text(with_table(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
