"""The extender's Prometheus series (catalogue entries of component `extender`) and its /metrics endpoint.

The hot path only observes: one histogram observation and one counter increment per verb call, and filter
adds one increment per distinct rejection reason (counted locally while it loops). The per-GPU allocated
memory and compute (the "allocated" side of the Utilisation dashboard) are read from the SchedulerCache when
Prometheus scrapes, on the event loop that owns the view, so no request pays for them and no thread races
the watch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tessera.extender.view import SchedulerCache
from tessera.metrics import ComponentMetrics

log = logging.getLogger(__name__)

MIB: Final = 1024 * 1024

# Reason codes: a fixed, small set so that label cardinality stays bounded whatever a message says.
NO_INVENTORY: Final = "no_inventory"
NO_GPU_REQUEST: Final = "no_gpu_request"
BAD_REQUEST: Final = "bad_request"
BAD_PLACEMENT: Final = "bad_placement"
PLACED_ELSEWHERE: Final = "placed_elsewhere"
NO_FIT: Final = "no_fit"
POD_NOT_FOUND: Final = "pod_not_found"
POD_RECREATED: Final = "pod_recreated"
NODE_MISMATCH: Final = "node_mismatch"  # bind: the pod does not select the node (node_selection)
API_ERROR: Final = "api_error"
HANDOFF_PENDING: Final = "handoff_pending"  # bind: another pod on the node still waits for its Allocate
CLAIM_UNREAD: Final = "claim_unread"  # bind (DRA): the claim made for the pod's tessera.io/gpu is not read
NONE: Final = "none"

# Bind outcomes.
OK: Final = "ok"
LOST_RACE: Final = "lost_race"
ERROR: Final = "error"


class ExtenderMetrics:
    """Typed handles on the extender's catalogue metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        m = ComponentMetrics.create("extender", self.registry)
        self._duration = m.histogram("tessera_extender_request_duration_seconds")
        self._requests = m.counter("tessera_extender_requests_total")
        self._binds = m.counter("tessera_extender_binds_total")
        self._rejected = m.counter("tessera_extender_rejected_nodes_total")
        self._memory = m.gauge("tessera_gpu_memory_allocated_bytes")
        self._compute = m.gauge("tessera_gpu_compute_allocated_ratio")

    def request(self, verb: str, started: float, ok: bool) -> None:
        """One verb call that began at `started` (time.perf_counter()) finished."""
        self._duration.labels(verb=verb).observe(time.perf_counter() - started)
        self._requests.labels(verb=verb, result="ok" if ok else "error").inc()

    def bind(self, outcome: str, reason: str = NONE) -> None:
        self._binds.labels(outcome=outcome, reason=reason).inc()

    def rejected(self, counts: Mapping[str, int]) -> None:
        for reason, n in counts.items():
            self._rejected.labels(reason=reason).inc(n)

    def refresh_allocated(self, view: SchedulerCache) -> None:
        """Set the per-GPU allocated gauges from the view; GPUs no longer in the view lose their series."""
        self._memory.clear()
        self._compute.clear()
        for node, gpus in view.nodes.items():
            for gpu in gpus:
                self._memory.labels(node=node, gpu=str(gpu.index)).set(gpu.used_memory * MIB)
                self._compute.labels(node=node, gpu=str(gpu.index)).set(gpu.used_compute / 100.0)

    def exposition(self, view: SchedulerCache) -> bytes:
        self.refresh_allocated(view)
        return generate_latest(self.registry)


def make_metrics_app(metrics: ExtenderMetrics, view: SchedulerCache) -> web.Application:
    """GET /metrics on its own port (`tessera extender --metrics-port`), served by the extender's loop."""

    async def serve(_: web.Request) -> web.Response:
        body = metrics.exposition(view)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", serve)
    return app
