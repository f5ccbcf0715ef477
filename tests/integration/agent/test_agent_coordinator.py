"""Jobs sharing a lane through the coordinator and `tessera.sdk.LaneClient` (issue 7, second "done when" item).

Clients are real SDK objects in threads doing timed "iterations" (sleeps) of different lengths, so shares are
measured from the clients' own clocks, not from the scheduler's bookkeeping.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tessera.sdk import LaneClient, LaneError
from tessera_agent.lanes.coordinator import LaneCoordinator

Interval = tuple[float, float, str]


def worker(
    sock: Path, job: str, iteration_s: float, start_at: float, stop_at: float, out: list[Interval]
) -> None:
    while time.monotonic() < start_at:
        time.sleep(0.001)
    with LaneClient(str(sock), lane="lane-0", job=job) as lane:
        n = 0
        while time.monotonic() < stop_at:
            with lane.iteration():
                t0 = time.monotonic()
                time.sleep(iteration_s)
                out.append((t0, time.monotonic(), job))
            n += 1
            lane.report_progress(n)


def shares(intervals: list[Interval], lo: float, hi: float) -> dict[str, float]:
    busy: dict[str, float] = {}
    for s, e, job in intervals:
        busy[job] = busy.get(job, 0.0) + max(0.0, min(e, hi) - max(s, lo))
    total = sum(busy.values())
    return {j: b / total for j, b in busy.items()}


def assert_never_overlap(intervals: list[Interval]) -> None:
    ordered = sorted(intervals)
    for (_s1, e1, j1), (s2, _e2, j2) in itertools.pairwise(ordered):
        assert s2 >= e1, f"iterations of {j1} and {j2} overlapped by {e1 - s2:.4f}s"


@pytest.fixture
async def coordinator(plugin_dir: Path, request: pytest.FixtureRequest) -> AsyncIterator[LaneCoordinator]:
    c = LaneCoordinator(plugin_dir / "coord.sock", policy=getattr(request, "param", "FAIR"))
    await c.start()
    yield c
    await c.stop()


async def run_jobs(sock: Path, plan: list[tuple[str, float, float, float]]) -> list[Interval]:
    out: list[Interval] = []
    threads = [threading.Thread(target=worker, args=(sock, j, it, a, b, out)) for j, it, a, b in plan]
    for t in threads:
        t.start()
    await asyncio.gather(*(asyncio.to_thread(t.join) for t in threads))
    return out


async def test_fair_halves_then_thirds_and_never_overlaps(coordinator: LaneCoordinator) -> None:
    t0 = time.monotonic() + 0.1
    join_c, end = t0 + 1.5, t0 + 3.0
    # iterations of 10 ms and 30 ms: round-robin would give 25%/75%; FAIR equalises GPU time
    out = await run_jobs(
        coordinator.socket_path,
        [("a", 0.010, t0, end), ("b", 0.030, t0, end), ("c", 0.020, join_c, end)],
    )
    assert_never_overlap(out)
    two = shares(out, t0 + 0.2, join_c)
    three = shares(out, join_c + 0.2, end - 0.05)
    assert two["a"] == pytest.approx(0.5, abs=0.08) and two["b"] == pytest.approx(0.5, abs=0.08), two
    for job in "abc":
        assert three[job] == pytest.approx(1 / 3, abs=0.08), three


@pytest.mark.parametrize("coordinator", ["FIFO"], indirect=True)
async def test_fifo_lets_the_first_job_hold_the_lane(coordinator: LaneCoordinator) -> None:
    t0 = time.monotonic() + 0.1
    out = await run_jobs(
        coordinator.socket_path, [("a", 0.010, t0, t0 + 0.6), ("b", 0.010, t0 + 0.05, t0 + 0.6)]
    )
    assert_never_overlap(out)
    assert shares(out, t0 + 0.1, t0 + 0.55)["a"] > 0.95  # so the FAIR test above can fail


async def test_progress_and_errors(coordinator: LaneCoordinator) -> None:
    def client() -> None:
        with LaneClient(str(coordinator.socket_path), lane="lane-0", job="p") as lane:
            assert lane.policy == "FAIR"
            with lane.iteration():
                pass
            lane.report_progress(3, total=10)
            assert coordinator.progress("lane-0") == {"p": (3, 10)}
            with pytest.raises(LaneError, match="already in this lane"):
                LaneClient(str(coordinator.socket_path), lane="lane-0", job="p")

    await asyncio.to_thread(client)
    with pytest.raises(LaneError, match="cannot reach the lane coordinator"):
        LaneClient(str(coordinator.socket_path) + ".missing", lane="x", job="y")
