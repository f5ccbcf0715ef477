"""The agent's probe endpoints (`--health-port`), served on its event loop.

- `/healthz`: 200 whenever the event loop answers. A loop stuck in a blocking call cannot answer, so the
  kubelet's liveness probe restarts the agent; a TCP probe of the metrics port (served from a thread of its
  own) would not see that.
- `/readyz`: 200 once the kubelet has taken the lanes' API — the device plugin registered, or the DRA driver
  registered and its ResourceSlice published — else 503 with what the agent is waiting for. The pod is Ready
  only when the node can allocate lanes, which a DaemonSet rollout (maxUnavailable) waits for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger(__name__)

Readiness = Callable[[], str | None]  # None: ready; else what is awaited, for the probe's body


class HealthServer:
    def __init__(self, port: int, readiness: Readiness, host: str = "0.0.0.0") -> None:
        self.port = port
        self.host = host
        self.readiness = readiness
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        waiting = self.readiness()
        if waiting is None:
            return web.Response(text="ok\n")
        return web.Response(
            status=503,
            text=json.dumps({"ready": False, "reason": waiting}) + "\n",
            content_type="application/json",
        )

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        self._runner = runner
        log.info("health endpoints (/healthz, /readyz) on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
