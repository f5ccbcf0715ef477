"""The gateway's HTTP front: Open Inference Protocol (KServe v2) REST endpoints over per-model services.

Endpoints: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}``,
``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` (each model path also under
``/v2/models/{name}/versions/{version}``), ``GET /metrics`` (Prometheus) and ``GET /stats`` (JSON counters
since start per model, for the operator's goodput and attainment report). Triton's model configuration,
statistics and repository extensions (:mod:`tessera.gateway.extensions`): ``GET
/v2/models/{name}/config``, ``GET /v2/models/{name}/stats`` (both also under a version),
``GET /v2/models/stats`` (every model), ``POST /v2/repository/index`` and, refused with a reason,
``POST /v2/repository/models/{name}/load`` and ``.../unload``. Inference takes JSON tensors
or the binary tensor data extension (``Inference-Header-Content-Length``). Every error is a JSON object
``{"error", "reason"}``, 404/405/413 included. :func:`Gateway.infer` is shared with the gRPC front
(:mod:`tessera.gateway.grpc_server`), so both give the same answers and errors.
A request's application tag comes from its model's ``app_header`` (``x-tessera-app`` unless configured;
untagged: ``default_app``) and an optional latency budget in milliseconds from ``x-tessera-deadline-ms``
(default: the model's ``slo_s``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tessera.api.contract import HEADER_DEADLINE_MS
from tessera.gateway.batch_wire import CLIENT_MAX_BODY
from tessera.gateway.config import ConfigError, GatewayConfig
from tessera.gateway.extensions import (
    EXTENSIONS,
    MODEL_CONTROL_REFUSED,
    REASON_MODEL_CONTROL,
    repository_index,
)
from tessera.gateway.http_errors import json_error
from tessera.gateway.metrics import ModelMetrics
from tessera.gateway.protocol import (
    HEADER_LENGTH,
    MODEL_VERSIONS,
    REASON_BAD_REQUEST,
    ProtocolError,
    error_json,
    loads,
    split_body,
    validate_request,
)
from tessera.gateway.service import ModelService, Outcome
from tessera.gateway.v2_routes import MODEL_BASES, ModelNotFound, V2Server, json_response
from tessera.metrics import ComponentMetrics

log = logging.getLogger(__name__)

DEFAULT_APP = "default"


@dataclass(frozen=True)
class GatewayError(Exception):
    """A request refused before it reached a model's queue: HTTP status, message and reason."""

    status: int
    message: str
    reason: str = REASON_BAD_REQUEST

    def outcome(self) -> Outcome:
        return Outcome(self.status, error_json(self.message, self.reason))


SERVER_EXTENSIONS = ["binary_tensor_data", *EXTENSIONS]


class Gateway:
    """All served models, their shared HTTP client session and metrics registry."""

    def __init__(self, config: GatewayConfig, *, registry: CollectorRegistry | None = None, seed: int = 0):
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.metrics = ComponentMetrics.create("gateway", self.registry)
        self.seed = seed
        self.services: dict[str, ModelService] = {}
        self.pool_router: Any = None  # tessera.gateway.pool.PoolRouter when the config has a pool
        self._reload_task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        # Who is counting, and since when: a reader that sees another instance knows the counters restarted.
        self.instance = uuid.uuid4().hex
        self.started = time.monotonic()

    def stats(self) -> dict[str, Any]:
        """Counters since this gateway started, per model; ``uptime_s`` on the gateway's monotonic clock,
        so a reader takes rates from two reads without trusting its own clock or the network delay."""
        return {
            "instance": self.instance,
            "uptime_s": time.monotonic() - self.started,
            "models": {name: svc.stats() for name, svc in self.services.items()},
            **({"pool_groups": self.pool_router.group_stats()} if self.pool_router is not None else {}),
        }

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
        if self.config.pool is not None:  # AlpaServe groups: one router shared by the pool's models
            from tessera.gateway.pool import PoolModelCfg, PoolModelService, PoolRouter

            pool = self.config.pool
            router = self.pool_router = PoolRouter(pool, self._session)
            self._health_task = asyncio.create_task(router.health_loop(self.config.health_interval_s))
            if pool.reload_from is not None:
                self._reload_task = asyncio.create_task(
                    self._reload_pool(pool.reload_from, pool.reload_interval_s)
                )
            for pm in pool.models:
                pcfg = PoolModelCfg(pm.name, pool.namespace, pm.slo_s)
                psvc = PoolModelService(
                    router,
                    pcfg,
                    ModelMetrics(self.metrics, pool.namespace, pm.deployment or pm.name, pm.slo_s),
                )
                await psvc.start(self.config.health_interval_s)
                self.services[pm.name] = psvc  # type: ignore[assignment]

    async def _reload_pool(self, path: str, interval: float) -> None:
        """Follow the pool section of the configuration file (a mounted ConfigMap the operator rewrites
        on re-placement): a changed group list switches routing in place, without a restart."""
        while True:
            await asyncio.sleep(interval)
            try:
                pool = GatewayConfig.load(path).pool
            except ConfigError as err:
                log.warning("pool configuration %s not reloaded: %s", path, err)
                continue
            router = self.pool_router
            if pool is None or router is None or pool == router.cfg:
                continue
            try:
                router.switch(pool)
            except ValueError as err:
                log.warning("pool configuration %s not applied: %s", path, err)
                continue
            for g in router.groups:
                if not g.healthy:
                    await router.check(g)

    async def close(self) -> None:
        for task in (self._reload_task, self._health_task):
            if task is not None:
                task.cancel()
        for svc in self.services.values():
            await svc.close()
        if self._session is not None:
            await self._session.close()

    @property
    def ready(self) -> bool:
        return all(s.ready for s in self.services.values())

    def service(self, name: str, version: str | None = None) -> ModelService:
        """The model ``name`` (at ``version``, when one is named); a 404 :class:`GatewayError` if none."""
        svc = self.services.get(name)
        if svc is None:
            raise GatewayError(404, f"unknown model {name!r}; served: {sorted(self.services)}", "not-found")
        if version not in (None, "", *MODEL_VERSIONS):
            raise GatewayError(
                404,
                f"model {name!r} has no version {version!r}; versions: {list(MODEL_VERSIONS)}",
                "not-found",
            )
        return svc

    def model_stats(self, name: str, version: str | None = None) -> list[dict[str, Any]]:
        """Entries of a statistics answer: the model ``name`` (at ``version``), or every model when
        ``name`` is empty; a 404 :class:`GatewayError` for a model or version not served."""
        if not name:
            return [svc.infer_stats.json(n) for n, svc in sorted(self.services.items())]
        return [self.service(name, version).infer_stats.json(name)]

    def repository_index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        return repository_index(((n, s.ready) for n, s in self.services.items()), ready_only=ready_only)

    async def infer(
        self,
        name: str,
        version: str | None,
        head: bytes,
        blob: bytes,
        *,
        app: str | None,
        deadline_ms: str | None,
        arrived: float,
    ) -> Outcome:
        """One inference request (its JSON ``head`` and binary bytes ``blob``), checked, queued on its
        model and answered: the path HTTP and gRPC share."""
        try:
            svc = self.service(name, version)
            try:
                body: Any = loads(head)
            except ValueError:
                raise GatewayError(400, "request body is not valid JSON") from None
            try:
                # Structure only: the worker decodes the tensors, once.
                inputs = validate_request(body, len(blob))
                budget = _budget(deadline_ms)
            except ProtocolError as err:
                raise GatewayError(400, str(err)) from None
        except GatewayError as err:
            return err.outcome()
        cid = body.get("id") if isinstance(body.get("id"), str) else None
        return await svc.infer(
            head,
            app=app or svc.cfg.default_app,
            budget=budget,
            client_id=cid,
            blob=blob,
            arrived=arrived,
            rows=int(inputs[0]["shape"][0]),  # validated: a non-empty list of integers
        )


GRPC_SERVER: web.AppKey[Any] = web.AppKey("grpc_server", object)
GRPC_PORT: web.AppKey[int] = web.AppKey("grpc_port", int)


def _budget(raw: str | None) -> float | None:
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


class _GatewayEndpoints(V2Server):
    """The gateway's v2 answers over its model services, plus ``/metrics`` and ``/stats``."""

    server_name = "tessera-gateway"
    extensions = SERVER_EXTENSIONS

    def __init__(self, gateway: Gateway, grpc_port: int | None, grpc_host: str) -> None:
        self.gateway = gateway
        self.grpc_port = grpc_port
        self.grpc_host = grpc_host

    def service(self, request: web.Request) -> ModelService:
        """The service a request's path names; a JSON 404 if the gateway does not serve it."""
        try:
            return self.gateway.service(request.match_info["name"], request.match_info.get("version"))
        except GatewayError as err:
            raise ModelNotFound(err.message) from None

    async def ready(self, _: web.Request) -> web.Response:
        ok = self.gateway.ready
        return json_response({"ready": ok}, status=200 if ok else 503)

    async def model_meta(self, request: web.Request) -> web.Response:
        return json_response(self.service(request).metadata())

    async def model_ready(self, request: web.Request) -> web.Response:
        svc = self.service(request)
        return json_response({"name": svc.cfg.name, "ready": svc.ready}, status=200 if svc.ready else 503)

    async def infer(self, request: web.Request) -> web.Response:
        arrived = time.perf_counter()
        name = request.match_info["name"]
        svc = self.gateway.services.get(name)
        try:
            head, blob = split_body(await request.read(), request.headers.get(HEADER_LENGTH))
        except ProtocolError as err:
            return json_error(400, str(err), REASON_BAD_REQUEST)
        out = await self.gateway.infer(
            name,
            request.match_info.get("version"),
            head,
            blob,
            app=request.headers.get(svc.cfg.app_header) if svc is not None else None,
            deadline_ms=request.headers.get(HEADER_DEADLINE_MS),
            arrived=arrived,
        )
        return _outcome_response(out)

    # -- Triton's extensions (tessera.gateway.extensions) ----------------------------------------
    def routes(self) -> list[web.RouteDef]:
        # Before the model routes: /v2/models/stats is every model's statistics, not a model "stats".
        routes = [web.get("/v2/models/stats", self.all_stats), *super().routes()]
        for base in MODEL_BASES:
            routes += [web.get(f"{base}/config", self.model_config), web.get(f"{base}/stats", self.stats_of)]
        return [
            *routes,
            web.post("/v2/repository/index", self.repository_index),
            web.post("/v2/repository/models/{name}/load", self.model_control),
            web.post("/v2/repository/models/{name}/unload", self.model_control),
        ]

    async def model_config(self, request: web.Request) -> web.Response:
        return json_response(self.service(request).model_config())

    async def stats_of(self, request: web.Request) -> web.Response:
        self.service(request)  # a JSON 404 for a model or version not served
        name, version = request.match_info["name"], request.match_info.get("version")
        return json_response({"model_stats": self.gateway.model_stats(name, version)})

    async def all_stats(self, _: web.Request) -> web.Response:
        return json_response({"model_stats": self.gateway.model_stats("")})

    async def repository_index(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/index`` with an empty body or ``{"ready": bool}``."""
        raw = await request.read()
        body: Any = {}
        if raw.strip():
            try:
                body = loads(raw)
            except ValueError:
                return json_error(400, "the repository index request is not valid JSON", REASON_BAD_REQUEST)
        ready = body.get("ready", False) if isinstance(body, dict) else None
        if not isinstance(ready, bool):
            return json_error(
                400, 'the repository index request must be {} or {"ready": true|false}', REASON_BAD_REQUEST
            )
        return json_response(self.gateway.repository_index(ready_only=ready))

    async def model_control(self, _: web.Request) -> web.Response:
        return json_error(400, MODEL_CONTROL_REFUSED, REASON_MODEL_CONTROL)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.gateway.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def stats(self, _: web.Request) -> web.Response:
        return json_response(self.gateway.stats())

    async def on_startup(self, app: web.Application) -> None:
        await self.gateway.start()
        if self.grpc_port is not None:
            from tessera.gateway.grpc_server import start_grpc  # grpcio only when gRPC is served

            server, port = await start_grpc(self.gateway, self.grpc_host, self.grpc_port)
            app[GRPC_SERVER], app[GRPC_PORT] = server, port

    async def on_cleanup(self, app: web.Application) -> None:
        server = app.get(GRPC_SERVER)
        if server is not None:
            await server.stop(grace=1.0)
        await self.gateway.close()


def _outcome_response(out: Outcome) -> web.Response:
    """An inference outcome as an HTTP answer: JSON, or a JSON header and binary outputs after it."""
    headers = {}
    if out.slo_met is not None:
        headers["x-tessera-slo"] = "met" if out.slo_met else "missed"
    if out.header_length is None:
        return web.Response(
            body=out.body, status=out.status, headers=headers, content_type="application/json"
        )
    headers[HEADER_LENGTH] = str(out.header_length)
    return web.Response(
        body=out.body, status=out.status, headers=headers, content_type="application/octet-stream"
    )


def make_gateway_app(
    gateway: Gateway, *, grpc_port: int | None = None, grpc_host: str = "127.0.0.1"
) -> web.Application:
    """The HTTP application; with ``grpc_port`` it also serves the gRPC front on that port (0: any free
    port, see ``app[GRPC_PORT]``) from the same event loop, over the same model queues."""
    endpoints = _GatewayEndpoints(gateway, grpc_port, grpc_host)
    app = endpoints.application(
        max_body=CLIENT_MAX_BODY,
        extra=[web.get("/metrics", endpoints.metrics), web.get("/stats", endpoints.stats)],
    )
    app.on_startup.append(endpoints.on_startup)
    app.on_cleanup.append(endpoints.on_cleanup)
    return app
