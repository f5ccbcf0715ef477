"""The gateway's HTTP front: Open Inference Protocol (KServe v2) REST endpoints over per-model services.

Endpoints: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}``,
``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` and ``GET /metrics`` (Prometheus).
A request's application tag comes from its model's ``app_header`` (``x-tessera-app`` unless configured;
untagged: ``default_app``) and an optional latency budget in milliseconds from ``x-tessera-deadline-ms``
(default: the model's ``slo_s``).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tessera.api.contract import HEADER_DEADLINE_MS
from tessera.gateway.config import ConfigError, GatewayConfig
from tessera.gateway.metrics import ModelMetrics
from tessera.gateway.protocol import ProtocolError, error_body, loads, validate_request
from tessera.gateway.service import ModelService
from tessera.metrics import ComponentMetrics

log = logging.getLogger(__name__)

DEFAULT_APP = "default"


class Gateway:
    """All served models, their shared HTTP client session and metrics registry."""

    def __init__(self, config: GatewayConfig, *, registry: CollectorRegistry | None = None, seed: int = 0):
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.metrics = ComponentMetrics.create("gateway", self.registry)
        self.seed = seed
        self.services: dict[str, ModelService] = {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No per-host connection cap: a worker runs one batch at a time, the gateway never has more in
        # flight than it has workers, plus health checks.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        rids = itertools.count().__next__
        for i, m in enumerate(self.config.models):
            try:
                svc = ModelService(
                    m,
                    self._session,
                    metrics=ModelMetrics(self.metrics, m.namespace, m.name, m.slo_s),
                    rng=random.Random(self.seed + i),
                    rid_source=rids,
                )
            except ValueError as err:
                raise ConfigError(f"model {m.name}: {err}") from err
            await svc.start(self.config.health_interval_s)
            self.services[m.name] = svc

    async def close(self) -> None:
        for svc in self.services.values():
            await svc.close()
        if self._session is not None:
            await self._session.close()


def _json_error(status: int, message: str, reason: str | None = None) -> web.Response:
    return web.json_response(error_body(message, reason), status=status)


def _budget(request: web.Request) -> float | None:
    raw = request.headers.get(HEADER_DEADLINE_MS)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise ProtocolError(
            f"header {HEADER_DEADLINE_MS} must be a number of milliseconds, got {raw!r}"
        ) from None
    if not math.isfinite(ms) or ms <= 0:
        raise ProtocolError(f"header {HEADER_DEADLINE_MS} must be > 0 milliseconds, got {raw!r}")
    return ms / 1000.0


def make_gateway_app(gateway: Gateway) -> web.Application:
    def service(request: web.Request) -> ModelService:
        name = request.match_info["name"]
        svc = gateway.services.get(name)
        if svc is None:
            raise web.HTTPNotFound(
                text=f'{{"error": "unknown model {name!r}; served: {sorted(gateway.services)}"}}',
                content_type="application/json",
            )
        return svc

    async def server_meta(_: web.Request) -> web.Response:
        return web.json_response({"name": "tessera-gateway", "version": "1", "extensions": []})

    async def live(_: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(_: web.Request) -> web.Response:
        ok = all(s.ready for s in gateway.services.values())
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def model_meta(request: web.Request) -> web.Response:
        return web.json_response(service(request).metadata())

    async def model_ready(request: web.Request) -> web.Response:
        svc = service(request)
        return web.json_response({"name": svc.cfg.name, "ready": svc.ready}, status=200 if svc.ready else 503)

    async def infer(request: web.Request) -> web.Response:
        svc = service(request)
        raw = await request.read()
        try:
            body: Any = loads(raw)
        except ValueError:
            return _json_error(400, "request body is not valid JSON", "bad-request")
        try:
            validate_request(body)  # structure only: the worker decodes the tensors, once
            budget = _budget(request)
        except ProtocolError as err:
            return _json_error(400, str(err), "bad-request")
        app = request.headers.get(svc.cfg.app_header) or svc.cfg.default_app
        cid = body.get("id") if isinstance(body.get("id"), str) else None
        out = await svc.infer(raw, app=app, budget=budget, client_id=cid)
        headers = {}
        if out.slo_met is not None:
            headers["x-tessera-slo"] = "met" if out.slo_met else "missed"
        return web.Response(
            body=out.body, status=out.status, headers=headers, content_type="application/json"
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(gateway.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes(
        [
            web.get("/v2", server_meta),
            web.get("/v2/health/live", live),
            web.get("/v2/health/ready", ready),
            web.get("/v2/models/{name}", model_meta),
            web.get("/v2/models/{name}/ready", model_ready),
            web.post("/v2/models/{name}/infer", infer),
            web.get("/metrics", metrics),
        ]
    )

    async def on_startup(_: web.Application) -> None:
        await gateway.start()

    async def on_cleanup(_: web.Application) -> None:
        await gateway.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
