"""Liveness of the operator's passes, for kopf's probes on the `--liveness` endpoint.

An arbiter round, or a TrialGroup or ModelDeployment pass, holds its controller's lock while it runs; one
that does not end (an await that never returns, requests that each wait out their 300 s timeout) holds
back every later one: no lease is renewed, no pod created. `PassClock` times the passes; a probe fails
once a pass has run longer than the deadline, so the kubelet restarts the operator (and a standby peer
takes over). A peer that runs no passes (paused by peering, or with nothing to do) is alive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import kopf


class PassClock:
    """When the pass in progress began, and when the last one ended (on the operator's clock)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started: float | None = None
        self.ended: float | None = None
        self.passes = 0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        self.started = self.clock()
        try:
            yield
        finally:
            self.started = None
            self.ended = self.clock()
            self.passes += 1

    def report(self, deadline_s: float) -> dict[str, float | int | None]:
        """What the probe shows: passes so far, seconds since the last ended, seconds the current one has
        run. Raises `kopf.PermanentError` (the probe answers 500 at once) past `deadline_s`."""
        now = self.clock()
        running = None if self.started is None else max(0.0, now - self.started)
        if running is not None and running > deadline_s:
            raise kopf.PermanentError(f"a pass has run {running:.0f}s (deadline {deadline_s:g}s)")
        since = None if self.ended is None else max(0.0, now - self.ended)
        return {"passes": self.passes, "secondsSinceLastPass": since, "runningSeconds": running}
