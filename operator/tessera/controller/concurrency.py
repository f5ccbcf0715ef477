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
