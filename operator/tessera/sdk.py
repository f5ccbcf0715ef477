"""Workload-side SDK: share a lane cooperatively and report progress.

    from tessera.sdk import LaneClient
    with LaneClient() as lane:                # lane, job and socket from the env the agent injected
        for step in range(steps):
            with lane.iteration():            # blocks until the lane coordinator grants this job the lane
                train_step()
            lane.report_progress(step + 1, total=steps)

The coordinator (node agent, `tessera_agent.lanes.coordinator`) runs one iteration per lane at a time, chosen by
the lane's FIFO/PACK/SRTF/FAIR policy (Salus §2.4). The wire protocol is documented in docs/node-agent.md:
JSON lines over a unix socket. The agent serves both sockets to the pod's own processes only: it maps each
connection to its pod (the process's cgroup), so a process reports progress only for its own pod and joins
only the lane its pod was assigned; the sockets are group-only, so the pod needs the agent's socket group
in `securityContext.supplementalGroups` unless it runs as root (docs/node-agent.md).

Progress needs no coordinator: `report_progress(n, total=m, loss=x)` posts to `TESSERA_PROGRESS_ENDPOINT`
(injected by the agent's Allocate; `tessera_agent.lanes.progress`), and the agent writes the pod's
`tessera.io/progress` annotation, which the operator reads. `LaneClient.report_progress` does both.
This module depends on nothing but the standard library.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

from tessera.api import contract


class LaneError(RuntimeError):
    """The coordinator refused a request or could not be reached."""


class ProgressError(RuntimeError):
    """The progress endpoint is not set, could not be reached, or refused the report."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._socket_path)


def report_progress(
    iterations: int,
    total: int | None = None,
    *,
    loss: float | None = None,
    endpoint: str | None = None,
    timeout_s: float = 5.0,
) -> str:
    """Report iterations done to the node agent, which writes the pod's `tessera.io/progress`.

    `endpoint` defaults to `$TESSERA_PROGRESS_ENDPOINT`: `http+unix://<percent-encoded socket>/<path>` (what
    the agent injects) or `http://host:port/<path>`. Returns the annotation value written. Each call is one
    API write on the agent's side, so report every few seconds rather than every step.
    """
    if iterations < 0 or (total is not None and total < 0):
        raise ValueError("iterations and total must not be negative")
    url = endpoint or os.environ.get(contract.ENV_PROGRESS_ENDPOINT, "")
    if not url:
        raise ProgressError(f"no progress endpoint: pass endpoint or set {contract.ENV_PROGRESS_ENDPOINT}")
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "http+unix":
        conn = _UnixHTTPConnection(unquote(parts.netloc), timeout_s)
    elif parts.scheme == "http":
        conn = http.client.HTTPConnection(parts.netloc, timeout=timeout_s)
    else:
        raise ProgressError(f"progress endpoint {url!r} must start with http+unix:// or http://")
    body: dict[str, Any] = {"iterations": iterations, "total": total, "ts": time.time()}
    if loss is not None:
        body["loss"] = loss
    try:
        conn.request(
            "POST", parts.path or "/", json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        reply = json.loads(resp.read() or b"{}")
    except (OSError, ValueError) as err:
        raise ProgressError(f"cannot report progress to {url}: {err}") from err
    finally:
        conn.close()
    if resp.status != 200 or not reply.get("ok"):
        raise ProgressError(f"progress endpoint refused the report ({resp.status}): {reply.get('error')}")
    return str(reply.get("annotation", ""))


class LaneClient:
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
        try:  # a refused join (another pod's lane, a process outside the pod) leaves nothing open
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
        except LaneError:
            self.close()
            raise

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            self._file.write(json.dumps(msg, allow_nan=False).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        except (OSError, ValueError) as err:  # ValueError: NaN/inf in msg, or the connection was closed
            raise LaneError(f"lane coordinator request {msg.get('op')!r} failed: {err}") from err
        if not line:
            raise LaneError("the lane coordinator closed the connection")
        try:
            reply = json.loads(line)
        except ValueError as err:
            raise LaneError(f"unreadable reply from the lane coordinator: {line[:80]!r}") from err
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise LaneError(f"lane coordinator refused {msg.get('op')!r}: {error}")
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

    def report_progress(
        self, iterations: int, total: int | None = None, *, loss: float | None = None
    ) -> None:
        """Tell the coordinator, and the operator too when `TESSERA_PROGRESS_ENDPOINT` is set."""
        if iterations < 0 or (total is not None and total < 0):
            raise ValueError("iterations and total must not be negative")
        self._call({"op": "progress", "iterations": iterations, "total": total})
        if os.environ.get(contract.ENV_PROGRESS_ENDPOINT):
            report_progress(iterations, total, loss=loss)

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> LaneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
