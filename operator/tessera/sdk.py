"""Workload-side SDK: share a lane cooperatively and report progress.

    from tessera.sdk import Lane
    with Lane() as lane:                      # lane, job and socket from the env the agent injected
        for step in range(steps):
            with lane.iteration():            # blocks until the lane coordinator grants this job the lane
                train_step()
            lane.report_progress(step + 1, total=steps)

The coordinator (node agent, `tessera_agent.coordinator`) runs one iteration per lane at a time, chosen by
the lane's FIFO/PACK/SRTF/FAIR policy (seed-salus-fluid.md part 1). The wire protocol is documented there:
JSON lines over a unix socket. This module depends on nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tessera.api import contract


class LaneError(RuntimeError):
    """The coordinator refused a request or could not be reached."""


class Lane:
    def __init__(
        self,
        socket_path: str | None = None,
        *,
        lane: str | None = None,
        job: str | None = None,
        remaining_seconds: float | None = None,
        memory_mib: int = 0,
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        self.socket_path = socket_path or os.environ.get(contract.ENV_COORDINATOR_SOCKET, "")
        self.lane = lane or os.environ.get(contract.ENV_LANE_ID, "")
        self.job = job or os.environ.get(contract.ENV_JOB) or os.environ.get("HOSTNAME", "")
        if not self.socket_path:
            raise LaneError(
                f"no coordinator socket: pass socket_path or set {contract.ENV_COORDINATOR_SOCKET}"
            )
        if not self.lane or not self.job:
            raise LaneError(f"lane and job are required (set {contract.ENV_LANE_ID} and {contract.ENV_JOB})")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(self.socket_path)
        except OSError as err:
            self._sock.close()
            raise LaneError(f"cannot reach the lane coordinator at {self.socket_path}: {err}") from err
        self._file = self._sock.makefile("rwb")
        self.policy = str(
            self._call(
                {
                    "op": "join",
                    "lane": self.lane,
                    "job": self.job,
                    "remaining_seconds": remaining_seconds,
                    "memory_mib": memory_mib,
                    "priority": priority,
                }
            ).get("policy", "")
        )

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._file.write(json.dumps(msg).encode() + b"\n")
        self._file.flush()
        line = self._file.readline()
        if not line:
            raise LaneError("the lane coordinator closed the connection")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise LaneError(f"lane coordinator refused {msg.get('op')!r}: {reply.get('error')}")
        return reply

    @contextmanager
    def iteration(self, *, remaining_seconds: float | None = None, last: bool = False) -> Iterator[None]:
        """Run the body as one iteration: wait for the lane, and release it afterwards even on error.

        The next iteration is queued as this one ends (iterations run back to back) unless `last` is set;
        `remaining_seconds` updates the estimate SRTF ranks by.
        """
        self._call({"op": "begin"})
        try:
            yield
        finally:
            self._call({"op": "end", "remaining_seconds": remaining_seconds, "next": not last})

    def report_progress(self, iterations: int, total: int | None = None) -> None:
        if iterations < 0 or (total is not None and total < 0):
            raise ValueError("iterations and total must not be negative")
        self._call({"op": "progress", "iterations": iterations, "total": total})

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> Lane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
