"""prometheus-client objects for the node agent, made from the metric catalogue (tessera.api.metrics_catalog).

The agent may not import `tessera.metrics`, so this is its counterpart: only catalogue entries whose
components include the agent are created, so the agent cannot export a series the dashboards do not know.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import Component, MetricType


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, Counter] = {}
        self._histograms: dict[str, Histogram] = {}
        for spec in catalog.for_component(Component.AGENT):
            if spec.type is MetricType.COUNTER:
                self._counters[spec.name] = Counter(
                    spec.name.removesuffix("_total"), spec.help, spec.labels, registry=self.registry
                )
            elif spec.type is MetricType.GAUGE:
                self._gauges[spec.name] = Gauge(spec.name, spec.help, spec.labels, registry=self.registry)
            else:
                self._histograms[spec.name] = Histogram(
                    spec.name,
                    spec.help,
                    spec.labels,
                    registry=self.registry,
                    buckets=spec.buckets or Histogram.DEFAULT_BUCKETS,
                )
        try:
            ver = version("tessera")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
            ver = "unknown"
        self.gauge("tessera_build_info").labels(component=Component.AGENT.value, version=ver).set(1)

    def gauge(self, name: str) -> Gauge:
        try:
            return self._gauges[name]
        except KeyError:
            raise KeyError(f"{name!r} is not an agent gauge in the metric catalogue") from None

    def counter(self, name: str) -> Counter:
        try:
            return self._counters[name]
        except KeyError:
            raise KeyError(f"{name!r} is not an agent counter in the metric catalogue") from None

    def histogram(self, name: str) -> Histogram:
        try:
            return self._histograms[name]
        except KeyError:
            raise KeyError(f"{name!r} is not an agent histogram in the metric catalogue") from None
