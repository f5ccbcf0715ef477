"""The BE feedback loop on a GPU with an HP lane (Orion's SM_THRESHOLD search, as MPS allows it).

Every `step(now)`, for each GPU that has an HP lane and BE lanes, the HP lane's p99 (serving latency, or
iteration time from the progress socket, fed into a `WindowedLatency`) goes to the GPU's `PBeController`
(`tessera.policy.orion.controller`), which bisects the BE active-thread percentage toward
`p99_hp ≤ (1 + ε)·p99_dedicated` with a minimum interval and a hysteresis band. MPS reads the percentage only
when a client starts, so a change is applied by restarting BE pods, and only those that checkpoint
(`tessera.io/checkpoints: "true"`); the others keep their share until they end. Every change, and every
change held back, is an event on the pods concerned, and the percentage and restarts are metrics.

In DRA mode a lane is a claim's, keyed by the claim's UID, and the pods that run in it are the pods the claim is
reserved for (`pods_of`); a change first reaches the claims that stay prepared (`on_share`: their CDI spec and
their MPS daemon's defaults, so a pod that keeps its claim restarts with the new share), then the loop restarts
the checkpointing pods of each BE claim, with the claim checked again (`kubelet/dra_feedback.py`).

`p99_dedicated` per GPU is the HP pod's `tessera.io/p99-dedicated-seconds` when it says one (a GPU that
starts shared never shows the HP lane alone, and the loop would otherwise stay idle there), else given,
else measured by the loop itself while the GPU's HP lane runs alone.
The agent imports only `tessera.api` and `tessera.cluster` (docs/architecture.md); this module is the one
exception, importing the pure, stdlib-only controller so that the simulator and the agent run the same
bisection rather than two copies of it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tessera.policy.orion.controller import PBeController, PBeDecision

from tessera_agent.lanes.book import LaneBook, PodLane
from tessera_agent.lanes.restarts import RestartRefused
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod

log = logging.getLogger(__name__)

REASON_CHANGED = "BEComputeShareChanged"
REASON_HELD = "BEComputeShareHeld"
REASON_NOT_RESTARTED = "BENotRestarted"


class Restarter(Protocol):
    async def restart(self, lane: PodLane, reason: str) -> None:
        """Delete the BE pod so its controller recreates it (it resumes from its checkpoint)."""
        ...


class EventSink(Protocol):
    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None: ...


class LatencySource(Protocol):
    def p99(self, gpu: str, now: float) -> float | None: ...


@dataclass
class WindowedLatency:
    """Latency samples of each GPU's HP lane over the last `window_s` seconds; p99 by nearest rank."""

    window_s: float = 60.0
    min_samples: int = 20
    _samples: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)

    def record(self, gpu: str, latency_s: float, now: float) -> None:
        if not math.isfinite(latency_s) or latency_s < 0:
            raise ValueError(f"latency must be a non-negative number, got {latency_s!r}")
        self._samples.setdefault(gpu, deque()).append((now, latency_s))

    def reset(self, gpu: str) -> None:
        """Forget samples (after a change: what follows reflects the new share)."""
        self._samples.pop(gpu, None)

    def p99(self, gpu: str, now: float) -> float | None:
        q = self._samples.get(gpu)
        if not q:
            return None
        while q and q[0][0] < now - self.window_s:
            q.popleft()
        if len(q) < self.min_samples:
            return None
        xs = sorted(x for _, x in q)
        return xs[max(0, math.ceil(0.99 * len(xs)) - 1)]


@dataclass
class ProgressLatency:
    """Iteration times of HP lanes from the progress endpoint, into a `WindowedLatency` per GPU.

    Each accepted report (after the endpoint's peer and lane checks) gives (iterations, receipt time); the
    time per iteration since the pod's previous report is one sample on each GPU where the pod holds the HP
    lane. The agent's own receipt clock is used, not the report's `ts`, so a workload sets how often it
    reports but not how long its iterations took. A pod that reports every k iterations yields the mean of
    each k, so the p99 is over k-iteration means (a smoother signal than per-iteration times).
    """

    book: LaneBook
    latency: WindowedLatency
    # The lanes (book keys) a pod holds: its own UID with the device plugin; in DRA mode the claims prepared for it.
    lanes_of: Callable[[NodePod], Collection[str]] | None = None
    _last: dict[str, tuple[int, float]] = field(default_factory=dict)  # pod UID → (iterations, time)

    def on_report(self, pod: NodePod, iterations: int, now: float) -> None:
        held = self.lanes_of(pod) if self.lanes_of is not None else (pod.uid,)
        gpus = [ln.gpu for ln in self.book.lanes.values() if ln.uid in held and ln.klass == "HP"]
        prev = self._last.get(pod.uid)
        self._last[pod.uid] = (iterations, now)
        if not gpus or prev is None or iterations <= prev[0] or now <= prev[1]:
            return  # not an HP lane, a first report, or a restart of the count: no interval to measure
        per_iteration = (now - prev[1]) / (iterations - prev[0])
        for gpu in gpus:
            self.latency.record(gpu, per_iteration, now)

    def forget(self, live_uids: set[str]) -> None:
        for uid in [u for u in self._last if u not in live_uids]:
            del self._last[uid]


def agent_metrics_sink(metrics: AgentMetrics) -> Callable[[str, Mapping[str, str], float], None]:
    """`on_metric` writing to the agent's catalogue metrics: gauges are set, counters incremented."""

    def sink(name: str, labels: Mapping[str, str], value: float) -> None:
        if name.endswith("_total"):
            metrics.counter(name).labels(**labels).inc(value)
        else:
            metrics.gauge(name).labels(**labels).set(value)

    return sink


@dataclass(frozen=True)
class Change:
    gpu: str
    old: int
    new: int
    p99: float
    target: float
    restarted: tuple[str, ...]
    kept: tuple[str, ...]


def own_pod(lane: PodLane) -> list[PodLane]:
    """Device-plugin mode: a lane is its pod's."""
    return [lane]


@dataclass
class InterferenceLoop:
    book: LaneBook
    latency: LatencySource
    restarter: Restarter
    events: EventSink
    node: str = ""
    p99_dedicated: dict[str, float] = field(default_factory=dict)
    epsilon: float = 0.15
    min_interval_s: float = 300.0
    hysteresis: int = 5
    p_min: int = 5
    p_max: int = 100
    on_metric: Callable[[str, Mapping[str, str], float], None] | None = None  # (name, labels, value)
    # The pods running in a lane, each as a lane of its own (`PodLane.uid` the pod's): device plugin, the lane
    # itself; DRA, the pods its claim is reserved for. Events, restarts and the baseline annotation are theirs.
    pods_of: Callable[[PodLane], list[PodLane]] = own_pod
    # Called with (GPU, new share) once the book has it and before any restart: DRA's prepared claims take it.
    on_share: Callable[[str, int], Awaitable[None]] | None = None
    controllers: dict[str, PBeController] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)  # last proposal reported as held, per GPU

    def _metric(self, name: str, gpu: str, value: float, **labels: str) -> None:
        if self.on_metric is not None:
            self.on_metric(name, {"node": self.node, "uuid": gpu, **labels}, value)

    async def step(self, now: float) -> list[Change]:
        """One look at every GPU's HP p99; the BE share changes it led to (applied by restarting BE pods)."""
        changes = []
        for gpu in sorted({ln.gpu for ln in self.book.lanes.values()}):
            change = await self._step_gpu(gpu, now)
            if change is not None:
                changes.append(change)
        return changes

    async def _step_gpu(self, gpu: str, now: float) -> Change | None:
        hp = self.book.hp_lane(gpu)
        be = [ln for ln in self.book.on_gpu(gpu) if ln.klass == "BE"]
        p99 = self.latency.p99(gpu, now)
        if hp is None or p99 is None:
            return None
        self._learn_baseline(gpu, hp, p99, alone=not be)
        if not be or gpu not in self.p99_dedicated:
            return None  # nothing to share with, or no baseline yet: never guess one from a shared GPU
        ctl = self._controller(gpu)
        old = ctl.applied
        d = ctl.observe(now, p99)
        self._metric("tessera_lane_be_compute_ratio", gpu, ctl.applied / 100)
        why = f"HP {hp.pod} p99 {p99 * 1e3:.2f} ms vs target {ctl.target * 1e3:.2f} ms"
        if d.apply is None:
            await self._report_held(gpu, be, old, d, why)
            return None
        self._held.pop(gpu, None)
        self.book.set_be_percent(gpu, d.apply)
        if self.on_share is not None:
            await self.on_share(gpu, d.apply)
        restarted, kept = await self._apply(gpu, be, old, d.apply, d.reason, why)
        if isinstance(self.latency, WindowedLatency):
            self.latency.reset(gpu)
        log.info("GPU %s: BE share %d%% -> %d%% (%s), restarted %s", gpu, old, d.apply, why, restarted)
        return Change(gpu, old, d.apply, p99, ctl.target, tuple(restarted), tuple(kept))

    def _learn_baseline(self, gpu: str, hp: PodLane, p99: float, *, alone: bool) -> None:
        """The HP lane's p99 alone on its GPU: the HP pod's own word wins, else what it shows running alone."""
        said = next(
            (p.p99_dedicated_s for p in [hp, *self.pods_of(hp)] if p.p99_dedicated_s is not None), None
        )
        if said is not None:
            self.p99_dedicated[gpu] = said
        elif alone:
            self.p99_dedicated.setdefault(gpu, p99)

    def _controller(self, gpu: str) -> PBeController:
        """The GPU's controller; a new one when the baseline changed (another HP pod), starting from the
        share the GPU has now."""
        ctl = self.controllers.get(gpu)
        if ctl is not None and ctl.p99_dedicated == self.p99_dedicated[gpu]:
            return ctl
        ctl = self.controllers[gpu] = PBeController(
            self.p99_dedicated[gpu],
            self.epsilon,
            self.p_min,
            self.p_max,
            max(self.p_min, min(self.p_max, self.book.be_percent_of(gpu))),
            self.min_interval_s,
            self.hysteresis,
        )
        return ctl

    async def _report_held(self, gpu: str, be: list[PodLane], old: int, d: PBeDecision, why: str) -> None:
        """A change held back (interval, hysteresis): an event on each BE pod, once per proposal."""
        if not d.why_not or self._held.get(gpu) == d.proposed:
            return
        self._held[gpu] = d.proposed
        for pod in [p for ln in be for p in self.pods_of(ln)]:
            await self.events.event(
                pod.pod, REASON_HELD, f"BE share stays {old}% (would be {d.proposed}%): {d.why_not}; {why}"
            )

    async def _apply(
        self, gpu: str, be: list[PodLane], old: int, new: int, reason: str, why: str
    ) -> tuple[list[str], list[str]]:
        """Restart the BE pods the new share binds and that checkpoint; (restarted, kept) pod names."""
        restarted, kept = [], []
        for ln in be:
            if ln.compute_percent <= min(old, new):
                continue  # its own assigned share is the binding cap either way: nothing to apply
            msg = f"BE share {old}% → {new}% ({reason}): {why}"
            for pod in self.pods_of(ln):
                if await self._restart(pod, msg):
                    self._metric("tessera_lane_be_restarts_total", gpu, 1, reason=reason)
                    restarted.append(pod.pod)
                else:
                    kept.append(pod.pod)
        return restarted, kept

    async def _restart(self, ln: PodLane, msg: str) -> bool:
        """Restart one BE pod to apply `msg`'s change, with an event saying whether it was; True if it was."""
        if not ln.checkpoints:
            why_not = "it does not checkpoint"
        else:
            try:
                await self.restarter.restart(ln, msg)
            except RestartRefused as err:
                why_not = str(err)
            else:
                await self.events.event(ln.pod, REASON_CHANGED, msg + "; restarted to apply it")
                return True
        await self.events.event(
            ln.pod, REASON_NOT_RESTARTED, f"{msg}; not restarted: {why_not}", warning=True
        )
        return False
