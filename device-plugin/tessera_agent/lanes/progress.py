"""The progress endpoint: workloads report iterations done, the agent writes the pod's `tessera.io/progress`.

The operator reads progress from that annotation (or an App's status); this lets `tessera.sdk.report_progress`
work without the lane coordinator and without giving the workload API credentials. The agent serves plain
HTTP on a unix socket mounted into pods it allocates (or on a TCP port), and Allocate injects
`TESSERA_PROGRESS_ENDPOINT` naming the socket and the pod:

    http+unix://%2Frun%2Ftessera%2Fprogress%2Fprogress.sock/v1/namespaces/<ns>/pods/<name>/progress

    POST <path>  {"iterations": n, "total": m | null, "loss": x?, "ts": unix seconds?}
      200 {"ok": true, "annotation": "<what was written>"}
      400 / 413 / 404 / 403 {"ok": false, "error": "..."}: malformed or oversized report, pod not on this
      node, or the caller may not report for that pod

Who may write: the socket is mode 0660, group `socket_group` (the group workload pods are given), and each
request's peer process must run in the pod the path names (`tessera_agent.lanes.peers`: SO_PEERCRED pid → pod UID
in its cgroup path), a pod that holds a Tessera lane on this node: with the device plugin, one the extender
assigned a lane (`tessera.io/assignment`); with DRA, one a `gpu.tessera.io` claim prepared on this node is
reserved for (`LaneHolders`). A TCP port offers no peer credentials and is only for tests.

The annotation value is JSON {"iterations": n, "total": m | null, "loss": x (only when reported), "ts": t};
`ts` is the client's clock when given, else the agent's receipt time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tessera.api import contract

from tessera_agent.lanes.peers import PeerRefused, PeerResolver, credentials_of_transport
from tessera_agent.pods import NodePod, PodSource

log = logging.getLogger(__name__)

ROUTE = "/v1/namespaces/{namespace}/pods/{name}/progress"
MAX_BODY_BYTES = 4096  # a report is four numbers; anything larger is not one
MAX_COUNT = 2**53  # iterations and totals beyond this lose precision in JSON readers (the operator's too)


class LaneHolders:
    """Which pods hold a lane on this node. This one: the pods the extender assigned one, by their
    `tessera.io/assignment` (the device-plugin path); the DRA driver answers from its prepared claims."""

    async def refusal(self, pod: NodePod) -> str | None:
        """Why `pod` holds no lane here, or None when it holds one."""
        if pod.assignment is not None:
            return None
        return f"pod {pod.key} holds no Tessera lane ({contract.ANN_ASSIGNMENT})"


class ClaimHolders(LaneHolders):
    """DRA: pods a claim prepared on this node is reserved for; `holds(namespace, pod UID)` decides."""

    def __init__(self, node: str, holds: Callable[[str, str], Awaitable[bool]]) -> None:
        self.node = node
        self.holds = holds

    async def refusal(self, pod: NodePod) -> str | None:
        if await self.holds(pod.namespace, pod.uid):
            return None
        return (
            f"pod {pod.key} holds no Tessera lane (no {contract.DRA_DRIVER} claim prepared on node "
            f"{self.node} is reserved for it)"
        )


class ProgressReportError(ValueError):
    """A progress report that cannot be used, with the reason."""


Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT)]


class ProgressReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    iterations: Count
    total: Count | None = None
    loss: float | None = Field(default=None, allow_inf_nan=False)
    ts: float | None = Field(default=None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _within_total(self) -> ProgressReport:
        if self.total is not None and self.iterations > self.total:
            raise ValueError(f"iterations ({self.iterations}) exceed total ({self.total})")
        return self

    @classmethod
    def from_json(cls, data: Any, *, now: float) -> ProgressReport:
        """Validate a decoded JSON body; ProgressReportError names the first bad field. `ts` defaults to `now`."""
        if not isinstance(data, dict):
            raise ProgressReportError("a progress report must be a JSON object")
        try:
            report = cls.model_validate(data)
        except ValidationError as err:
            raise ProgressReportError(_first_error(err)) from None
        return report if report.ts is not None else report.model_copy(update={"ts": now})

    def to_annotation(self) -> str:
        out: dict[str, Any] = {"iterations": self.iterations, "total": self.total}
        if self.loss is not None:
            out["loss"] = self.loss
        out["ts"] = self.ts
        return json.dumps(out, separators=(",", ":"))


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"unknown field {loc!r}; expected iterations, total, loss, ts"
    if not loc:
        return msg
    return f"{loc}: {msg}, got {_short(first.get('input'))}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _reply(status: int, **body: Any) -> web.Response:
    return web.json_response({"ok": status == 200, **body}, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such route, wrong method) in the endpoint's JSON shape."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return _reply(
            err.status, error=f"{err.reason}: {request.method} {request.path}; expected POST {ROUTE}"
        )


class ProgressServer:
    """Serves the endpoint for pods on `node`; a pod holding a Tessera lane may write its own progress only.

    `peers` maps each connection to the caller's pod; None turns the check off (in-process tests and TCP).
    """

    def __init__(
        self,
        node: str,
        pods: PodSource,
        *,
        socket_path: Path | None = None,
        port: int | None = None,
        clock: Callable[[], float] = time.time,
        peers: PeerResolver | None = None,
        socket_group: int | None = None,
        shutdown_timeout_s: float = 2.0,
        on_report: Callable[[NodePod, int, float], None] | None = None,
        holders: LaneHolders | None = None,
    ) -> None:
        if (socket_path is None) == (port is None):
            raise ValueError("serve progress on exactly one of a unix socket or a TCP port")
        if port is not None and peers is not None:
            raise ValueError("a TCP port carries no peer credentials; serve on a unix socket to check them")
        self.node = node
        self.pods = pods
        self.socket_path = socket_path
        self.port = port
        self.peers = peers
        self.socket_group = socket_group
        self.shutdown_timeout_s = shutdown_timeout_s
        self.refusals = 0
        # (pod, iterations, receipt time) of each accepted report: the HP lane's iteration times
        self.on_report = on_report
        self.holders = holders if holders is not None else LaneHolders()
        self._clock = clock
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])
        app.router.add_post(ROUTE, self._post)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=self.shutdown_timeout_s)
        await self._runner.setup()
        site: web.BaseSite
        if self.socket_path is not None:
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            site = web.UnixSite(self._runner, str(self.socket_path))
            await site.start()
            restrict_socket(self.socket_path, self.socket_group)
        else:
            site = web.TCPSite(self._runner, port=self.port)
            await site.start()
        log.info(
            "progress endpoint on %s (peer check %s)",
            self.socket_path or f"port {self.port}",
            "on" if self.peers is not None else "OFF",
        )

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
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _reply(413, error=f"a progress report is at most {MAX_BODY_BYTES} bytes")
        received = self._clock()
        try:
            report = ProgressReport.from_json(json.loads(raw), now=received)
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors too
            reason = str(err) if isinstance(err, ProgressReportError) else f"the body is not JSON ({err})"
            return _reply(400, error=reason)
        pod: NodePod | None
        if self.peers is not None:
            try:
                creds = credentials_of_transport(request.transport)
                pod = await self.peers.pod_of(creds)
            except PeerRefused as err:
                return self._refuse(f"{ns}/{name}", str(err))
            if (pod.namespace, pod.name) != (ns, name):
                return self._refuse(f"{ns}/{name}", f"{creds} belongs to pod {pod.key}")
        else:
            pod = next(
                (p for p in await self.pods.pods_on_node(self.node) if p.namespace == ns and p.name == name),
                None,
            )
        if pod is None:
            return _reply(404, error=f"pod {ns}/{name} is not on node {self.node}")
        refusal = await self.holders.refusal(pod)
        if refusal is not None:
            return _reply(403, error=refusal)
        value = report.to_annotation()
        await self.pods.annotate(pod, {contract.ANN_PROGRESS: value})
        log.debug("pod %s progress %s", pod.key, value)
        if self.on_report is not None:
            self.on_report(pod, report.iterations, received)
        return _reply(200, annotation=value)

    def _refuse(self, target: str, reason: str) -> web.Response:
        self.refusals += 1
        log.warning("progress for %s refused: %s", target, reason)
        return _reply(403, error=f"may not report progress for pod {target}: {reason}")


def restrict_socket(path: Path, group: int | None) -> None:
    """Owner and `group` only (0660): workloads reach the socket through the group their pods are given."""
    if group is not None:
        os.chown(path, -1, group)
    path.chmod(0o660)
