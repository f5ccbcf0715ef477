"""The lane coordinator: jobs sharing a lane ask it, at iteration boundaries, whose iteration runs next.

Salus schedules at iteration granularity, one iteration at a time per lane (seed-salus-fluid.md part 1,
§1.9; [L733-736]); the choice is made by `tessera.policy.lanes.iteration` (FIFO, PACK, SRTF, FAIR). This is
the opt-in node-local service around it for cooperative training loops (`with lane.iteration():` in
`tessera.sdk`).

Wire protocol: one unix stream connection per job, one JSON object per line each way.
  {"op": "join", "lane": L, "job": J, "remaining_seconds": s?, "memory_mib": m?, "priority": p?}
  {"op": "begin"}                        -> answered only when the job is granted the lane
  {"op": "end", "remaining_seconds": s?, "next": true?}
  {"op": "progress", "iterations": n, "total": t?}
Every request gets {"ok": true, ...} or {"ok": false, "error": "..."}. Closing the connection leaves the lane.

`end` queues the job's next iteration at once unless `"next": false`: a training loop runs iterations back
to back, and only then does the policy see every job at the boundary. Were the finishing job not queued,
whoever else waits would always win and every policy would degrade to round-robin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.policy.lanes.iteration import (
    POLICIES,
    IterationScheduler,
    IterationSchedulerError,
    Policy,
    make_iteration_scheduler,
)

log = logging.getLogger(__name__)


class CoordinatorError(ValueError):
    """A request the coordinator cannot serve; sent back to the client as its error."""


@dataclass
class _LaneState:
    scheduler: IterationScheduler
    grants: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    progress: dict[str, tuple[int, int | None]] = field(default_factory=dict)


class LaneCoordinator:
    def __init__(
        self,
        socket_path: Path,
        *,
        policy: Policy = "FAIR",
        lane_policies: dict[str, Policy] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for p in [policy, *(lane_policies or {}).values()]:
            if p not in POLICIES:
                raise ValueError(f"unknown lane policy {p!r}; expected one of {', '.join(POLICIES)}")
        self.socket_path = socket_path
        self.policy = policy
        self.lane_policies = dict(lane_policies or {})
        self._clock = clock
        self._lanes: dict[str, _LaneState] = {}
        self._server: asyncio.AbstractServer | None = None

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
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        self.socket_path.chmod(0o666)  # jobs run as arbitrary UIDs
        log.info("lane coordinator on %s (default policy %s)", self.socket_path, self.policy)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # --- protocol ---
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lane: str | None = None
        job: str | None = None
        try:
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        raise CoordinatorError("each request must be a JSON object")
                    op = msg.get("op")
                    if op == "join":
                        if job is not None:
                            raise CoordinatorError(f"this connection already joined as job {job!r}")
                        lane, job = self._join(msg)
                        reply: dict[str, Any] = {
                            "ok": True,
                            "policy": type(self._lane(lane).scheduler).policy,
                        }
                    elif lane is None or job is None:
                        raise CoordinatorError(f"send 'join' before {op!r}")
                    elif op == "begin":
                        await self._begin(lane, job)
                        reply = {"ok": True}
                    elif op == "end":
                        self._end(lane, job, msg.get("remaining_seconds"), bool(msg.get("next", True)))
                        reply = {"ok": True}
                    elif op == "progress":
                        self._lane(lane).progress[job] = (int(msg["iterations"]), msg.get("total"))
                        reply = {"ok": True}
                    else:
                        raise CoordinatorError(f"unknown op {op!r}; expected join, begin, end or progress")
                except (
                    CoordinatorError,
                    IterationSchedulerError,
                    json.JSONDecodeError,
                    KeyError,
                    TypeError,
                ) as err:
                    reply = {"ok": False, "error": str(err)}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            if lane is not None and job is not None:
                self._leave(lane, job)
            writer.close()
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                await writer.wait_closed()

    def _lane(self, lane: str) -> _LaneState:
        try:
            return self._lanes[lane]
        except KeyError:
            raise CoordinatorError(f"no job has joined lane {lane!r}") from None

    def _join(self, msg: dict[str, Any]) -> tuple[str, str]:
        lane, job = str(msg.get("lane") or ""), str(msg.get("job") or "")
        if not lane or not job:
            raise CoordinatorError("join needs a non-empty 'lane' and 'job'")
        state = self._lanes.get(lane)
        if state is None:
            state = _LaneState(make_iteration_scheduler(self.lane_policies.get(lane, self.policy)))
            self._lanes[lane] = state
        state.scheduler.add_job(
            job,
            self._clock(),
            remaining_seconds=msg.get("remaining_seconds"),
            memory_mib=int(msg.get("memory_mib") or 0),
            priority=int(msg.get("priority") or 0),
        )
        log.info("job %s joined lane %s", job, lane)
        return lane, job

    async def _begin(self, lane: str, job: str) -> None:
        state = self._lane(lane)
        fut = state.grants.get(job)
        if fut is None:  # not queued by a previous `end`
            fut = self._queue(state, job)
            self._dispatch(lane)
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
