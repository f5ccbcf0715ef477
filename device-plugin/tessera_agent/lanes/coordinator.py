"""The lane coordinator: jobs sharing a lane ask it, at iteration boundaries, whose iteration runs next.

Salus schedules at iteration granularity, one iteration at a time per lane (Salus §2.3.3-2.4);
the choice is made by `tessera.policy.lanes.iteration` (FIFO, PACK, SRTF, FAIR). This is
the opt-in node-local service around it for cooperative training loops (`with lane.iteration():` in
`tessera.sdk`).

Wire protocol: one unix stream connection per job, one JSON object per line each way.
  {"op": "join", "lane": L, "job": J, "remaining_seconds": s?, "memory_mib": m?, "priority": p?}
  {"op": "begin"}                        -> answered only when the job is granted the lane
  {"op": "end", "remaining_seconds": s?, "next": true?}
  {"op": "progress", "iterations": n, "total": t?}
Every request gets {"ok": true, ...} or {"ok": false, "error": "..."}. Closing the connection leaves the lane.
A request is one line of at most MAX_LINE_BYTES, validated by the models below; a bad one gets an error reply
and the connection stays usable, except a line over the limit, which is answered and then closed.

Who may join: the socket is mode 0660, group `socket_group` (the group workload pods are given). With `peers`
set (the agent always sets it), the connecting process is mapped to its pod (`tessera_agent.lanes.peers`:
SO_PEERCRED pid → pod UID in its cgroup path) and may join only the lane its pod was assigned
(`tessera.io/assignment`); its job names are scoped to the pod (`<namespace>/<pod>/<job>`), so a pod sharing
the lane cannot take another pod's job name.

`end` queues the job's next iteration at once unless `"next": false`: a training loop runs iterations back
to back, and only then does the policy see every job at the boundary. Were the finishing job not queued,
whoever else waits would always win and every policy would degrade to round-robin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tessera.policy.lanes.iteration import (
    POLICIES,
    IterationScheduler,
    IterationSchedulerError,
    Policy,
    make_iteration_scheduler,
)

from tessera_agent.lanes.peers import PeerRefused, PeerResolver, credentials_of_transport, lane_of
from tessera_agent.lanes.progress import restrict_socket
from tessera_agent.pods import NodePod

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8192  # a request is a handful of short fields; longer lines are refused
MAX_NAME = 253  # lane and job names: a Kubernetes object name's length
MAX_COUNT = 2**53


class CoordinatorError(ValueError):
    """A request the coordinator cannot serve; sent back to the client as its error."""


class _ShuttingDown(Exception):
    """Set on waiting grants when the coordinator stops."""


Name = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_NAME)]
Seconds = Annotated[float | None, Field(default=None, ge=0, le=1e9, allow_inf_nan=False)]
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JoinMsg(_Msg):
    op: Literal["join"]
    lane: Name
    job: Name
    remaining_seconds: Seconds = None
    memory_mib: Annotated[int, Field(strict=True, ge=0, le=2**40)] | None = None
    priority: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31)] | None = None


class BeginMsg(_Msg):
    op: Literal["begin"]


class EndMsg(_Msg):
    op: Literal["end"]
    remaining_seconds: Seconds = None
    next: Annotated[bool, Field(strict=True)] = True


class ProgressMsg(_Msg):
    op: Literal["progress"]
    iterations: Count
    total: Count | None = None

    @model_validator(mode="after")
    def _within_total(self) -> ProgressMsg:
        if self.total is not None and self.iterations > self.total:
            raise ValueError(f"iterations ({self.iterations}) exceed total ({self.total})")
        return self


Request = JoinMsg | BeginMsg | EndMsg | ProgressMsg
_MODELS: dict[str, type[_Msg]] = {"join": JoinMsg, "begin": BeginMsg, "end": EndMsg, "progress": ProgressMsg}


def parse_request(line: bytes) -> Request:
    """One request line → its model; CoordinatorError says what is wrong, in one line."""
    try:
        data = pydantic_core.from_json(line, allow_inf_nan=False)
    except ValueError as err:
        raise CoordinatorError(f"a request must be one JSON object per line ({err})") from None
    if not isinstance(data, dict):
        raise CoordinatorError("each request must be a JSON object")
    op = data.get("op")
    model = _MODELS.get(op) if isinstance(op, str) else None
    if model is None:
        raise CoordinatorError(f"unknown op {_short(op)}; expected join, begin, end or progress")
    try:
        msg: Request = model.model_validate(data)  # type: ignore[assignment]
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        what = str(first["msg"]).removeprefix("Value error, ")
        raise CoordinatorError(
            f"{op}: {loc + ': ' if loc else ''}{what}" + (f", got {_short(first['input'])}" if loc else "")
        ) from None
    return msg


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class _LaneState:
    scheduler: IterationScheduler
    grants: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    progress: dict[str, tuple[int, int | None]] = field(default_factory=dict)


class LaneCoordinator:
    """Serves the lane coordinator socket. `peers` maps each connection to its pod; None turns the check off
    (in-process tests and benchmarks only)."""

    def __init__(
        self,
        socket_path: Path,
        *,
        policy: Policy = "FAIR",
        lane_policies: dict[str, Policy] | None = None,
        clock: Callable[[], float] = time.monotonic,
        peers: PeerResolver | None = None,
        socket_group: int | None = None,
        shutdown_timeout_s: float = 2.0,
        lanes_held: Callable[[NodePod], Awaitable[set[str]]] | None = None,
    ) -> None:
        for p in [policy, *(lane_policies or {}).values()]:
            if p not in POLICIES:
                raise ValueError(f"unknown lane policy {p!r}; expected one of {', '.join(POLICIES)}")
        self.socket_path = socket_path
        self.policy = policy
        self.lane_policies = dict(lane_policies or {})
        self.peers = peers
        # the lanes a pod holds, where its assignment does not say (DRA: the claims prepared for it)
        self.lanes_held = lanes_held
        self.socket_group = socket_group
        self.shutdown_timeout_s = shutdown_timeout_s
        self.refusals = 0
        self._clock = clock
        self._lanes: dict[str, _LaneState] = {}
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._stopping = False

    # --- views ---
    def service(self, lane: str) -> dict[str, float]:
        return self._lane(lane).scheduler.service()

    def progress(self, lane: str) -> dict[str, tuple[int, int | None]]:
        return dict(self._lane(lane).progress)

    # --- lifecycle ---
    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._stopping = False
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.socket_path), limit=MAX_LINE_BYTES
        )
        restrict_socket(self.socket_path, self.socket_group)
        log.info(
            "lane coordinator on %s (default policy %s, peer check %s)",
            self.socket_path,
            self.policy,
            "on" if self.peers is not None else "OFF",
        )

    async def stop(self) -> None:
        """Stop accepting, answer waiting `begin`s with an error, close every connection (bounded)."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        for state in self._lanes.values():
            for fut in state.grants.values():
                if not fut.done():
                    fut.set_exception(_ShuttingDown())
        if self._connections:
            _, pending = await asyncio.wait(set(self._connections), timeout=self.shutdown_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=self.shutdown_timeout_s)

    # --- protocol ---
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = _Connection()
        try:
            await self._converse(reader, writer, conn)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            if conn.lane is not None and conn.job is not None:
                self._leave(conn.lane, conn.job)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Connection
    ) -> None:
        while not self._stopping:
            try:
                line = await reader.readline()
            except ValueError:  # over the limit; the rest of that line cannot be told from the next request
                await _send(
                    writer, {"ok": False, "error": f"request line too long (limit {MAX_LINE_BYTES} bytes)"}
                )
                return
            if not line:
                return
            try:
                reply = await self._handle(parse_request(line), conn, writer)
            except (CoordinatorError, IterationSchedulerError) as err:
                reply = {"ok": False, "error": str(err)}
            except PeerRefused as err:
                self.refusals += 1
                log.warning("lane coordinator refused a request: %s", err)
                reply = {"ok": False, "error": str(err)}
            except _ShuttingDown:
                reply = {"ok": False, "error": "the lane coordinator is shutting down"}
            await _send(writer, reply)

    async def _handle(self, msg: Request, conn: _Connection, writer: asyncio.StreamWriter) -> dict[str, Any]:
        if isinstance(msg, JoinMsg):
            if conn.job is not None:
                raise CoordinatorError(f"this connection already joined as job {conn.job!r}")
            job = msg.job
            if self.peers is not None:
                pod = await self._caller(writer)
                held = await self.lanes_held(pod) if self.lanes_held is not None else {lane_of(pod)}
                if msg.lane not in held:
                    own = ", ".join(repr(h) for h in sorted(held)) or "none"
                    raise PeerRefused(f"pod {pod.key} may join only its own lane ({own}), not {msg.lane!r}")
                job = f"{pod.key}/{msg.job}"
            self._join(msg, job)
            conn.lane, conn.job = msg.lane, job
            return {"ok": True, "policy": type(self._lane(msg.lane).scheduler).policy}
        if conn.lane is None or conn.job is None:
            raise CoordinatorError(f"send 'join' before {msg.op!r}")
        if isinstance(msg, BeginMsg):
            await self._begin(conn.lane, conn.job)
        elif isinstance(msg, EndMsg):
            self._end(conn.lane, conn.job, msg.remaining_seconds, msg.next)
        else:
            self._lane(conn.lane).progress[conn.job] = (msg.iterations, msg.total)
        return {"ok": True}

    async def _caller(self, writer: asyncio.StreamWriter) -> NodePod:
        assert self.peers is not None
        return await self.peers.pod_of(credentials_of_transport(writer.transport))

    def _lane(self, lane: str) -> _LaneState:
        try:
            return self._lanes[lane]
        except KeyError:
            raise CoordinatorError(f"no job has joined lane {lane!r}") from None

    def _join(self, msg: JoinMsg, job: str) -> None:
        state = self._lanes.get(msg.lane)
        created = state is None
        if state is None:
            state = _LaneState(make_iteration_scheduler(self.lane_policies.get(msg.lane, self.policy)))
        state.scheduler.add_job(
            job,
            self._clock(),
            remaining_seconds=msg.remaining_seconds,
            memory_mib=msg.memory_mib or 0,
            priority=msg.priority or 0,
        )
        if created:  # only once the job is in, so a refused join leaves no empty lane behind
            self._lanes[msg.lane] = state
        log.info("job %s joined lane %s", job, msg.lane)

    async def _begin(self, lane: str, job: str) -> None:
        state = self._lane(lane)
        fut = state.grants.get(job)
        if fut is None:  # not queued by a previous `end`
            fut = self._queue(state, job)
            self._dispatch(lane)
        if not fut.done():
            log.debug("job %s waits for lane %s", job, lane)
        await fut
        if state.grants.get(job) is fut:
            del state.grants[job]

    def _end(self, lane: str, job: str, remaining: float | None, queue_next: bool) -> None:
        state = self._lane(lane)
        state.scheduler.finish(job, self._clock(), remaining_seconds=remaining)
        if queue_next:
            self._queue(state, job)
        self._dispatch(lane)

    def _queue(self, state: _LaneState, job: str) -> asyncio.Future[None]:
        state.scheduler.request(job, self._clock())
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.grants[job] = fut
        return fut

    def _leave(self, lane: str, job: str) -> None:
        state = self._lanes[lane]
        state.scheduler.remove_job(job, self._clock())
        fut = state.grants.pop(job, None)
        if fut is not None and not fut.done():
            fut.cancel()
        state.progress.pop(job, None)
        log.info("job %s left lane %s", job, lane)
        if not state.scheduler.jobs():
            del self._lanes[lane]
        else:
            self._dispatch(lane)

    def _dispatch(self, lane: str) -> None:
        state = self._lanes[lane]
        chosen = state.scheduler.grant(self._clock())
        if chosen is not None:
            state.grants[chosen].set_result(None)


@dataclass
class _Connection:
    lane: str | None = None
    job: str | None = None


async def _send(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
    writer.write(pydantic_core.to_json(reply) + b"\n")
    await writer.drain()
