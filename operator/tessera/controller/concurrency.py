"""Run independent API calls together, at most `limit` in flight.

A round's writes (one App's pods, each App's status) are independent requests; sent one after another
each pays a full round trip to the API server, and unbounded they would flood it (client-go's default
QPS/burst exist for the same reason).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def gather_limited(calls: Iterable[Awaitable[T]], limit: int) -> list[T | BaseException]:
    """Await every call with at most `limit` running; results (or the exception each raised) in order.

    Exceptions are returned, not raised, so one failed call never abandons the others half-way (a gang
    must know which of its pods were created to roll them back)."""
    if limit < 1:
        raise ValueError(f"concurrency limit must be >= 1, got {limit}")
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls), return_exceptions=True))


async def drain_limited(calls: Iterable[Awaitable[T]], limit: int) -> list[T | BaseException]:
    """Await every call with `limit` workers pulling them from `calls` one at a time; results (or the
    exception each raised) in completion order.

    Unlike `gather_limited` no task is made per call and `calls` is read lazily: a generator that works
    out what to send (an arbiter round's N statuses, most of them unchanged) does that work while the
    calls already sent are in flight, instead of all of it before the first one goes out."""
    if limit < 1:
        raise ValueError(f"concurrency limit must be >= 1, got {limit}")
    pending = iter(calls)
    out: list[T | BaseException] = []

    async def worker() -> None:
        for call in pending:  # shared: each worker takes the next call when it is free
            try:
                out.append(await call)
            except Exception as err:  # returned, as gather_limited does, so the other calls go on
                out.append(err)

    await asyncio.gather(*(worker() for _ in range(limit)))
    return out
