"""The gateway's serving metrics for one model, built from the metric catalogue (tessera.api.metrics_catalog):
per-request latency, batch size, SLO hit/miss/drop counts, queue length and the SLO itself."""

from __future__ import annotations

from tessera.metrics import ComponentMetrics

OUTCOME_MET = "slo_met"
OUTCOME_MISSED = "slo_missed"
OUTCOME_DROPPED = "dropped"


class ModelMetrics:
    """Series of one ModelDeployment (labels ``namespace``, ``modeldeployment``)."""

    def __init__(self, metrics: ComponentMetrics, namespace: str, model: str, slo_s: float) -> None:
        labels = {"namespace": namespace, "modeldeployment": model}
        self._requests = metrics.counter("tessera_serving_requests_total")
        self._labels = labels
        self._latency = metrics.histogram("tessera_serving_request_latency_seconds").labels(**labels)
        self._batch = metrics.histogram("tessera_serving_batch_size").labels(**labels)
        self._queue = metrics.gauge("tessera_serving_queue_length").labels(**labels)
        metrics.gauge("tessera_serving_slo_seconds").labels(**labels).set(slo_s)
        for outcome in (OUTCOME_MET, OUTCOME_MISSED, OUTCOME_DROPPED):  # export zeros from the start
            self._requests.labels(**labels, outcome=outcome)

    def finished(self, outcome: str, latency_s: float | None) -> None:
        self._requests.labels(**self._labels, outcome=outcome).inc()
        if latency_s is not None:
            self._latency.observe(latency_s)

    def batch(self, size: int) -> None:
        self._batch.observe(size)

    def queue_length(self, n: int) -> None:
        self._queue.set(n)
