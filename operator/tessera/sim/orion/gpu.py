"""A kernel-level model of one GPU shared by several clients (processes or streams).

Each client has a *stream*: the kernels it has released run one after another, in order. A scheduler (see
`schedulers.py`) decides when each client's next kernel is released; the GPU then shares its SMs between the
kernels at the heads of the streams.

The GPU model, in three rules, each chosen to show one effect the paper relies on:
1. SM sharing. A kernel can use `min(sm_needed, cap)` SMs, `cap` its client's MPS active-thread share. SMs are
   water-filled by priority level (the HP client first when the mechanism honours priorities: CUDA stream
   priorities, or MPS client priority), proportionally to demand within a level.
2. No preemption (Orion §5.1.2): the hardware dispatches blocks as running ones retire, in launch order among kernels
   of equal priority, so a kernel holding more SMs than its share keeps them until it completes (its later
   waves take the SMs its earlier waves free). Only a higher-priority kernel's blocks jump that queue: then a
   BE kernel gives SMs back at the end of its current wave (`duration / waves` after its start, waves =
   ceil(sm_needed / usable SMs)); a single-wave kernel still keeps them to the end.
3. Bandwidth contention. With the SM shares fixed, the running kernels' compute and memory-bandwidth loads
   L_c, L_m add up (each kernel's alone utilisation × the fraction of its SM demand it holds). A kernel slows by
   the overload of its dominant resource, and of the other in proportion to its relative use of it:
   `max(1, (c/u)·L_c/PEAK, (m/u)·L_m/PEAK)`, u = max(c, m). PEAK = 0.9 is the achievable fraction of the
   hardware peak, the one constant fitted to Orion's Table 2 (§3.2): it makes BN2d‖BN2d take 1.65 ms as
   measured; Conv2d‖Conv2d then gives 1.0× and Conv2d‖BN2d 1.32× (paper 0.98× and 1.41×; a test checks the
   order).

Event-driven and deterministic: events are arrivals, kernel completions and wave ends of kernels that must
give SMs back. Times are seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from .kernels import Kernel

EPS = 1e-12
PEAK = 0.9  # achievable fraction of peak compute / memory bandwidth (fitted to Table 2, see above)


@dataclass(frozen=True)
class ClientSpec:
    name: str
    hp: bool
    kernels: tuple[Kernel, ...]  # one request (inference) or one iteration (training)
    arrivals: tuple[float, ...] | None = None  # request arrival times; None: closed loop (training)
    cap_percent: int = 100  # MPS active-thread percentage
    module_size: int = 4  # kernels per module, for module-granularity throttling
    gap_s: float = 0.0  # closed loop: host-side time between iterations (data loading, Python), GPU unused

    def __post_init__(self) -> None:
        if not self.kernels:
            raise ValueError(f"client {self.name} has no kernels")
        if not 1 <= self.cap_percent <= 100:
            raise ValueError(f"client {self.name}: cap_percent must be in 1..100, got {self.cap_percent}")


@dataclass(slots=True)
class Running:
    kernel: Kernel
    client: Client
    start: float
    demand: float  # SMs it may hold: min(sm_needed, MPS cap, SMs)
    full: float  # SMs its alone duration refers to: min(sm_needed, SMs)
    tau: float  # duration of one wave of blocks
    remaining: float = 1.0  # fraction of the kernel left
    held: float = 0.0
    locked_until: float | None = None
    rate: float = 0.0


@dataclass(slots=True)
class Client:
    spec: ClientSpec
    pending: deque[float] = field(default_factory=deque)  # arrival times of requests not started
    next_arrival: int = 0
    job_active: bool = False
    job_arrival: float = 0.0
    next_idx: int = 0  # next kernel of the job to release
    done_idx: int = 0  # kernels of the job completed
    stream: deque[int] = field(default_factory=deque)
    running: Running | None = None
    outstanding_s: float = 0.0  # expected duration of released, not completed kernels
    outstanding_kernels: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (arrival, latency)
    jobs_done: int = 0
    ready_at: float = 0.0  # closed loop: when the next iteration may start

    @property
    def hp(self) -> bool:
        return self.spec.hp

    @property
    def head(self) -> Kernel | None:
        """The next kernel the client would release, if its current job has one left."""
        if self.job_active and self.next_idx < len(self.spec.kernels):
            return self.spec.kernels[self.next_idx]
        return None

    @property
    def in_flight(self) -> bool:
        """A job has kernels released and not all complete (Orion's `hp_task_running`)."""
        return self.job_active and self.next_idx > 0

    def release(self) -> Kernel:
        k = self.spec.kernels[self.next_idx]
        self.stream.append(self.next_idx)
        self.next_idx += 1
        self.outstanding_s += k.duration
        self.outstanding_kernels += 1
        return k

    def progress(self) -> float:
        """Jobs completed, with the current job's completed kernels as a fraction."""
        return self.jobs_done + self.done_idx / len(self.spec.kernels)


class KernelScheduler(Protocol):
    name: str
    priority: bool  # whether the HP client's kernels get SMs first

    def cap_percent(self, client: ClientSpec) -> int: ...

    def release(self, sim: GpuSim, t: float) -> None: ...


@dataclass
class BusySeconds:
    sm_s: float = 0.0
    compute_s: float = 0.0
    membw_s: float = 0.0


class GpuSim:
    def __init__(self, clients: list[ClientSpec], scheduler: KernelScheduler, num_sms: int = 80) -> None:
        if sum(c.hp for c in clients) > 1:
            raise ValueError("at most one HP client per GPU")
        self.num_sms = num_sms
        self.scheduler = scheduler
        self.clients = [Client(c) for c in clients]
        self.caps = [max(1.0, scheduler.cap_percent(c) / 100 * num_sms) for c in clients]
        self.usage = BusySeconds()
        self.events = 0
        self.t = 0.0

    @property
    def hp(self) -> Client | None:
        return next((c for c in self.clients if c.hp), None)

    @property
    def be(self) -> list[Client]:
        return [c for c in self.clients if not c.hp]

    def _arrivals(self, t: float) -> None:
        for c in self.clients:
            arr = c.spec.arrivals
            if arr is None:
                if not c.job_active and t >= c.ready_at - EPS:
                    c.job_active, c.job_arrival, c.next_idx, c.done_idx = True, t, 0, 0
                continue
            while c.next_arrival < len(arr) and arr[c.next_arrival] <= t + EPS:
                c.pending.append(arr[c.next_arrival])
                c.next_arrival += 1
            if not c.job_active and c.pending:
                c.job_active, c.job_arrival, c.next_idx, c.done_idx = True, c.pending.popleft(), 0, 0

    def _start_heads(self, t: float) -> None:
        for i, c in enumerate(self.clients):
            if c.running is None and c.stream:
                k = c.spec.kernels[c.stream.popleft()]
                demand = min(float(k.sm_needed), self.caps[i], float(self.num_sms))
                waves = max(1, math.ceil(k.sm_needed / demand))
                full = min(float(k.sm_needed), float(self.num_sms))
                c.running = Running(k, c, t, demand, full, k.duration * demand / full / waves)

    def _fill(self, runs: list[Running], capacity: float) -> dict[int, float]:
        """Water-fill `capacity` SMs by priority level, proportionally to demand within a level."""
        out: dict[int, float] = {}
        levels = [[r for r in runs if r.client.hp], [r for r in runs if not r.client.hp]]
        if not self.scheduler.priority:
            levels = [runs]
        for group in levels:
            want = sum(r.demand for r in group)
            if want <= 0:
                continue
            share = min(1.0, capacity / want)
            for r in group:
                out[id(r)] = r.demand * share
            capacity -= min(capacity, want)
        return out

    def _allocate(self, t: float) -> list[Running]:
        runs = [c.running for c in self.clients if c.running is not None]
        target = self._fill(runs, float(self.num_sms))
        kept: list[Running] = []
        for r in runs:
            if r.held > target[id(r)] + 1e-9:
                if r.locked_until is None:
                    if self.scheduler.priority and not r.client.hp:  # HP blocks jump the queue
                        r.locked_until = r.start + r.tau * math.ceil((t - r.start) / r.tau + 1e-9)
                    else:
                        r.locked_until = math.inf  # FIFO block dispatch: kept until it completes
                if t < r.locked_until - EPS:
                    kept.append(r)
                    continue
            r.locked_until = None
        kept_ids = {id(r) for r in kept}
        rest = [r for r in runs if id(r) not in kept_ids]
        alloc = self._fill(rest, self.num_sms - sum(r.held for r in kept))
        for r in rest:
            r.held = alloc[id(r)]
        comp = sum(r.kernel.compute * r.held / r.full for r in runs)
        mem = sum(r.kernel.memory * r.held / r.full for r in runs)
        for r in runs:
            k = r.kernel
            u = max(k.compute, k.memory)
            slow = max(1.0, k.compute / u * comp / PEAK, k.memory / u * mem / PEAK)
            r.rate = (r.held / r.full) / (k.duration * slow)
        self._loads = (sum(r.held for r in runs), min(1.0, comp), min(1.0, mem))
        return runs

    def _next_arrival(self) -> float:
        nxt = math.inf
        for c in self.clients:
            arr = c.spec.arrivals
            if arr is not None and c.next_arrival < len(arr):
                nxt = min(nxt, arr[c.next_arrival])
            elif arr is None and not c.job_active:
                nxt = min(nxt, c.ready_at)
        return nxt

    def _complete(self, c: Client, t: float) -> None:
        assert c.running is not None
        c.outstanding_s -= c.running.kernel.duration
        c.outstanding_kernels -= 1
        c.running = None
        c.done_idx += 1
        if c.done_idx == len(c.spec.kernels):
            c.latencies.append((c.job_arrival, t - c.job_arrival))
            c.jobs_done += 1
            c.job_active = False
            c.next_idx = c.done_idx = 0
            c.ready_at = t + c.spec.gap_s

    def run(self, horizon: float, warmup: float = 0.0) -> None:
        """Simulate until `horizon`; usage counts from `warmup` on."""
        t = self.t
        while True:
            self._arrivals(t)
            self.scheduler.release(self, t)
            self._start_heads(t)
            runs = self._allocate(t)
            dt = self._next_arrival() - t
            for r in runs:
                if r.rate > 0:
                    dt = min(dt, r.remaining / r.rate)
                if r.locked_until is not None and t + EPS < r.locked_until < math.inf:
                    dt = min(dt, r.locked_until - t)
            if not math.isfinite(dt) or t + dt >= horizon:
                dt = horizon - t
            dt = max(dt, 0.0)
            if t + dt > warmup:
                span = t + dt - max(t, warmup)
                sm, comp, mem = self._loads
                self.usage.sm_s += sm / self.num_sms * span
                self.usage.compute_s += comp * span
                self.usage.membw_s += mem * span
            for r in runs:
                r.remaining -= r.rate * dt
            t += dt
            self.events += 1
            for r in runs:
                if r.remaining <= 1e-9:
                    self._complete(r.client, t)
            if t >= horizon - EPS:
                break
        self.t = t
