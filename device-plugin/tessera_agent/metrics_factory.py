"""prometheus-client objects for the node agent, created from the metric catalogue.

The agent may import only `tessera.api` and `tessera.cluster` of the control plane (DESIGN.md), so it has
this small factory of its own instead of `tessera.metrics`; both read `tessera.api.metrics_catalog`, so
names, types, labels and buckets cannot drift apart.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import Component, MetricType

log = logging.getLogger(__name__)


class AgentMetrics:
    """Every catalogue metric the agent exports, registered in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._metrics: dict[str, MetricWrapperBase] = {}
        for spec in catalog.for_component(Component.AGENT):
            if spec.type is MetricType.COUNTER:
                metric: MetricWrapperBase = Counter(
                    spec.name.removesuffix("_total"), spec.help, spec.labels, registry=registry
                )
            elif spec.type is MetricType.GAUGE:
                metric = Gauge(spec.name, spec.help, spec.labels, registry=registry)
            else:
                metric = Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)
            self._metrics[spec.name] = metric
        self.gauge("tessera_build_info").labels(component=Component.AGENT.value, version=_version()).set(1)
        log.debug("registered %d agent metrics", len(self._metrics))

    def gauge(self, name: str) -> Gauge:
        metric = self._get(name)
        if not isinstance(metric, Gauge):
            raise TypeError(f"{name!r} is a {type(metric).__name__}, not a Gauge")
        return metric

    def counter(self, name: str) -> Counter:
        metric = self._get(name)
        if not isinstance(metric, Counter):
            raise TypeError(f"{name!r} is a {type(metric).__name__}, not a Counter")
        return metric

    def _get(self, name: str) -> MetricWrapperBase:
        metric = self._metrics.get(name)
        if metric is None:
            spec = catalog.get(name)  # KeyError naming the catalogue for an unknown name
            owners = ", ".join(sorted(c.value for c in spec.components))
            raise KeyError(f"{name!r} is exported by {owners}, not by the node agent")
        return metric


def _version() -> str:
    try:
        return version("tessera")
    except PackageNotFoundError:  # running from a source tree without installing
        return "unknown"
