"""The BE feedback loop on a simulated latency signal: convergence, no flapping, restarts only of BE pods that
checkpoint and only within the minimum interval, events for every change."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import pytest
from tessera.api.assignment import Assignment
from tessera_agent.lanes.book import LaneBook, PodLane
from tessera_agent.lanes.interference import (
    REASON_CHANGED,
    REASON_HELD,
    REASON_NOT_RESTARTED,
    InterferenceLoop,
    WindowedLatency,
    agent_metrics_sink,
)
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod

U0 = "GPU-aaaa"


def pod(name: str, workload: str, checkpoints: bool = False, compute: int = 100) -> NodePod:
    a = Assignment(node="n", gpu_uuids=[U0], lane_id=name, memory_mib=2000, compute_percent=compute)
    return NodePod("ns", name, f"uid-{name}", "t", (1,), a, workload=workload, checkpoints=checkpoints)


@dataclass
class Recorder:
    restarts: list[tuple[float, str]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    now: float = 0.0

    async def restart(self, lane: PodLane, reason: str) -> None:
        self.restarts.append((self.now, lane.pod))

    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((pod, reason, message))


def hp_p99(p_be: int) -> float:
    """Simulated HP p99 (seconds): 10 ms alone, +0.6% per BE point past 25%; target 11.5 ms ↔ p_be ≤ 50."""
    return 0.010 * (1 + max(0, p_be - 25) * 0.006)


def run(
    loop: InterferenceLoop, rec: Recorder, lat: WindowedLatency, book: LaneBook, steps: int, dt: float
) -> None:
    async def go() -> None:
        for _ in range(steps):
            shared = any(ln.klass == "BE" for ln in book.on_gpu(U0))
            for _ in range(30):
                lat.record(U0, hp_p99(book.be_percent_of(U0) if shared else 0), rec.now)
            await loop.step(rec.now)
            rec.now += dt

    asyncio.run(go())


def setup(min_interval: float = 300.0) -> tuple[InterferenceLoop, Recorder, WindowedLatency, LaneBook]:
    book = LaneBook({U0: 16000}, default_be_percent=90)
    lat = WindowedLatency(window_s=30, min_samples=20)
    rec = Recorder()
    loop = InterferenceLoop(book, lat, rec, rec, node="n", min_interval_s=min_interval, hysteresis=3)
    return loop, rec, lat, book


def test_baseline_measured_alone_then_converges_without_flapping() -> None:
    loop, rec, lat, book = setup()
    metrics = AgentMetrics()
    loop.on_metric = agent_metrics_sink(metrics)
    book.admit(pod("hp", "serving:latency-critical"))
    run(loop, rec, lat, book, 2, 60)  # HP alone: the loop learns its dedicated p99
    assert loop.p99_dedicated[U0] == pytest.approx(0.010)
    book.admit(pod("be1", "training:best-effort", checkpoints=True))
    book.admit(pod("be2", "training:best-effort", checkpoints=False))
    run(loop, rec, lat, book, 60, 60)
    final = book.be_percent_of(U0)
    assert hp_p99(final) <= 1.15 * 0.010 + 1e-12
    assert final >= 45  # close to the largest share meeting the target (50)
    times = [t for t, _ in rec.restarts]
    assert len(times) <= 7  # bisection over 100 points
    assert all(b - a >= 300 for a, b in itertools.pairwise(times))  # minimum interval
    assert all(p == "ns/be1" for _, p in rec.restarts)  # only the BE pod that checkpoints
    assert not [t for t in times if t > rec.now / 2]  # settled: nothing in the second half
    reg = metrics.registry
    share = reg.get_sample_value("tessera_lane_be_compute_ratio", {"node": "n", "uuid": U0})
    assert share == pytest.approx(final / 100)
    restarts = sum(
        reg.get_sample_value("tessera_lane_be_restarts_total", {"node": "n", "uuid": U0, "reason": r}) or 0
        for r in ("over-target", "under-target")
    )
    assert restarts == len(rec.restarts)
    reasons = {r for _, r, _ in rec.events}
    assert {REASON_CHANGED, REASON_NOT_RESTARTED, REASON_HELD} <= reasons
    assert all(p != "ns/hp" for p, _, _ in rec.events)


def test_no_baseline_no_guess() -> None:
    loop, rec, lat, book = setup()
    book.admit(pod("hp", "serving:latency-critical"))
    book.admit(pod("be", "training:best-effort", checkpoints=True))
    run(loop, rec, lat, book, 5, 60)
    assert not rec.restarts and book.be_percent_of(U0) == 90


def test_be_already_below_both_shares_is_not_restarted() -> None:
    loop, rec, lat, book = setup(min_interval=0)
    loop.p99_dedicated[U0] = 0.010
    book.admit(pod("hp", "serving:latency-critical"))
    book.admit(pod("tiny", "trial:best-effort", checkpoints=True, compute=10))
    run(loop, rec, lat, book, 10, 60)
    assert book.be_percent_of(U0) < 90 and not rec.restarts


def test_windowed_latency() -> None:
    w = WindowedLatency(window_s=10, min_samples=3)
    assert w.p99(U0, 0) is None
    for i in range(100):
        w.record(U0, i / 1000, now=0.0)
    assert w.p99(U0, 5.0) == pytest.approx(0.098)  # nearest rank: the 99th of 100 samples
    assert w.p99(U0, 11.0) is None  # all samples aged out
    with pytest.raises(ValueError):
        w.record(U0, float("nan"), 0)
