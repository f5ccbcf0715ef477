"""The progress endpoint: workloads report iterations done, the agent writes the pod's `tessera.io/progress`.

The operator reads progress from that annotation (or an App's status); this lets `tessera.sdk.report_progress`
work without the lane coordinator and without giving the workload API credentials. The agent serves plain
HTTP on a unix socket mounted into pods it allocates (or on a TCP port), and Allocate injects
`TESSERA_PROGRESS_ENDPOINT` naming the socket and the pod:

    http+unix://%2Frun%2Ftessera%2Fprogress%2Fprogress.sock/v1/namespaces/<ns>/pods/<name>/progress

    POST <path>  {"iterations": n, "total": m | null, "loss": x?, "ts": unix seconds?}
      200 {"ok": true, "annotation": "<what was written>"}
      400 / 404 / 403 {"ok": false, "error": "..."}: malformed report, pod not on this node, pod holds no lane

The annotation value is JSON {"iterations": n, "total": m | null, "loss": x (only when reported), "ts": t};
`ts` is the client's clock when given, else the agent's receipt time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from tessera.api import contract

from .pods import PodSource

log = logging.getLogger(__name__)

ROUTE = "/v1/namespaces/{namespace}/pods/{name}/progress"


class ProgressError(ValueError):
    """A progress report that cannot be used, with the reason."""


@dataclass(frozen=True)
class ProgressReport:
    iterations: int
    total: int | None
    loss: float | None
    ts: float

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> ProgressReport:
        if not isinstance(data, dict):
            raise ProgressError("a progress report must be a JSON object")
        unknown = set(data) - {"iterations", "total", "loss", "ts"}
        if unknown:
            raise ProgressError(f"unknown fields {sorted(unknown)}; expected iterations, total, loss, ts")
        iterations, total = data.get("iterations"), data.get("total")
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
            raise ProgressError(f"iterations must be a whole number >= 0, got {iterations!r}")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            raise ProgressError(f"total must be a whole number >= 0 or null, got {total!r}")
        if total is not None and iterations > total:
            raise ProgressError(f"iterations ({iterations}) exceed total ({total})")
        loss = _finite(data.get("loss"), "loss")
        ts = _finite(data.get("ts"), "ts")
        return cls(iterations, total, loss, now if ts is None else ts)

    def to_annotation(self) -> str:
        out: dict[str, Any] = {"iterations": self.iterations, "total": self.total}
        if self.loss is not None:
            out["loss"] = self.loss
        out["ts"] = self.ts
        return json.dumps(out, separators=(",", ":"))


def _finite(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProgressError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _reply(status: int, **body: Any) -> web.Response:
    return web.json_response({"ok": status == 200, **body}, status=status)


class ProgressServer:
    """Serves the endpoint for pods on `node`; only pods holding a Tessera lane may write."""

    def __init__(
        self,
        node: str,
        pods: PodSource,
        *,
        socket_path: Path | None = None,
        port: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (socket_path is None) == (port is None):
            raise ValueError("serve progress on exactly one of a unix socket or a TCP port")
        self.node = node
        self.pods = pods
        self.socket_path = socket_path
        self.port = port
        self._clock = clock
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(ROUTE, self._post)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site: web.BaseSite
        if self.socket_path is not None:
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            site = web.UnixSite(self._runner, str(self.socket_path))
            await site.start()
            self.socket_path.chmod(0o666)  # workloads run as arbitrary UIDs
        else:
            site = web.TCPSite(self._runner, port=self.port)
            await site.start()
        log.info("progress endpoint on %s", self.socket_path or f"port {self.port}")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def _post(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        try:
            report = ProgressReport.from_json(await request.json(), now=self._clock())
        except json.JSONDecodeError as err:
            return _reply(400, error=f"the body is not JSON ({err})")
        except ProgressError as err:
            return _reply(400, error=str(err))
        pod = next(
            (p for p in await self.pods.pods_on_node(self.node) if p.namespace == ns and p.name == name), None
        )
        if pod is None:
            return _reply(404, error=f"pod {ns}/{name} is not on node {self.node}")
        if pod.assignment is None:
            return _reply(403, error=f"pod {ns}/{name} holds no Tessera lane ({contract.ANN_ASSIGNMENT})")
        value = report.to_annotation()
        await self.pods.annotate(pod, {contract.ANN_PROGRESS: value})
        log.debug("pod %s progress %s", pod.key, value)
        return _reply(200, annotation=value)
