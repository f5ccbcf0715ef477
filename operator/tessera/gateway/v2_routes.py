"""The Open Inference Protocol (KServe v2) endpoints the gateway and the worker both serve.

``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, and per model ``GET /v2/models/{name}``,
``GET /v2/models/{name}/ready`` and ``POST /v2/models/{name}/infer``, each model path also under
``/v2/models/{name}/versions/{version}``. A server subclasses :class:`V2Server` with its own answers;
the route table, the JSON error middleware, the 404 for an unknown model and :func:`serve` (run until
SIGTERM, then drain) are shared.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from aiohttp import web

from tessera.gateway.http_errors import json_errors
from tessera.gateway.protocol import dumps, error_json

MODEL_BASES = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


class ModelNotFound(web.HTTPNotFound):
    """A 404 with the v2 JSON error object, for a model (or version) this server does not serve."""

    def __init__(self, message: str) -> None:
        super().__init__(text=error_json(message, "not-found").decode(), content_type="application/json")


class V2Server(ABC):
    """The v2 handlers of one server; :meth:`application` serves them with the shared route table."""

    server_name: ClassVar[str]
    extensions: ClassVar[Sequence[str]]

    async def server_meta(self, _: web.Request) -> web.Response:
        return json_response({"name": self.server_name, "version": "1", "extensions": list(self.extensions)})

    async def live(self, _: web.Request) -> web.Response:
        return json_response({"live": True})

    @abstractmethod
    async def ready(self, request: web.Request) -> web.Response: ...

    @abstractmethod
    async def model_meta(self, request: web.Request) -> web.Response: ...

    @abstractmethod
    async def model_ready(self, request: web.Request) -> web.Response: ...

    @abstractmethod
    async def infer(self, request: web.Request) -> web.Response: ...

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.get("/v2", self.server_meta),
            web.get("/v2/health/live", self.live),
            web.get("/v2/health/ready", self.ready),
        ]
        for base in MODEL_BASES:
            routes += [
                web.get(base, self.model_meta),
                web.get(f"{base}/ready", self.model_ready),
                web.post(f"{base}/infer", self.infer),
            ]
        return routes

    def application(self, *, max_body: int, extra: Sequence[web.RouteDef] = ()) -> web.Application:
        """An application serving the v2 routes and ``extra`` ones, every error a v2 JSON object."""
        app = web.Application(client_max_size=max_body, middlewares=[json_errors])
        app.add_routes([*self.routes(), *extra])
        return app


# On SIGTERM (or SIGINT) run_app stops accepting connections and gives requests in flight this long to
# finish before cancelling them: inside kubelet's default 30 s grace period.
SHUTDOWN_SECONDS = 10.0


def serve(app: web.Application, host: str, port: int) -> None:
    """Serve `app` until SIGTERM or SIGINT, then drain requests in flight for up to SHUTDOWN_SECONDS."""
    web.run_app(app, host=host, port=port, print=None, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
