"""Waiting on the agent in the event loop: poll a condition until it holds, with a generous deadline (the
suite must not flake on a loaded 2-core machine); the deadline bounds only a failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEADLINE_S = 30.0


async def until(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
