"""The operator's metrics (catalogue names from tessera.api.metrics_catalog), in one registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tessera.metrics import ComponentMetrics


def operator_metrics(registry: CollectorRegistry | None = None) -> ComponentMetrics:
    return ComponentMetrics.create("operator", registry or CollectorRegistry())
