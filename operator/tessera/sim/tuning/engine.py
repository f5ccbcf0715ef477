"""Discrete-event execution of one tuning job on a pool of GPUs, with FIFO or Fluid execution.

FIFO is each algorithm's default execution (one trial per GPU worker, first come first served; Fluid
dissertation §3.2.1). Fluid calls the policy functions the operator calls: StaticFluid widths when a
TrialGroup arrives (on the idle GPUs), `place` for lanes and gangs, and DynamicFluid when resources free
up and no trial is waiting (§3.3.3). Trial speed follows Eq. 3.2 with the *actual*
number of neighbours on a packed GPU, times the cluster's placement slowdown for a multi-machine gang.
A reconfiguration pauses the trial for ε seconds. The pool can change (a Themis lease): see `set_pool`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, Protocol

from tessera.cluster import Cluster, Sensitivity
from tessera.policy.fluid import (
    FluidConfig,
    Rule,
    RuntimeModel,
    TrialDemand,
    choose_gang,
    dynamic_rescale,
    place,
    rescale_rule,
    static_widths,
)
from tessera.policy.fluid.placement import PackedLane
from tessera.policy.hpo import Decision, Result, TrialRun, TuningAlgorithm

log = logging.getLogger(__name__)
Executor = Literal["fifo", "fluid"]
# What Fluid takes as a trial's remaining h_{i,1}: up to its next milestone ("rung": the budget the
# algorithm has committed, as in ASHA's rung jobs; a TrialGroup gives each trial a training budget, Fluid
# dissertation §3.3.2), or up to its maximum budget ("budget"). Same for synchronous algorithms (no milestones).
Horizon = Literal["rung", "budget"]
# When the time-to-target metric sees a trial's score: after every training iteration (Ray Tune trials
# report each iteration and the paper plots "max accuracy over time", Fig. 3.10), or only
# at the algorithm's milestones. The algorithm itself always decides at milestones only.
Observe = Literal["iteration", "milestone"]
_TOL = 1e-9


class TrialModel(Protocol):
    @property
    def gpu_util(self) -> float: ...  # share of a GPU one trial keeps busy alone

    @property
    def target(self) -> float: ...  # score that counts as reaching the target (time-to-target)

    def iteration_time(self, spec: TrialRun) -> float: ...

    def runtime_model(self, spec: TrialRun) -> RuntimeModel: ...

    def score(self, spec: TrialRun, iteration: int) -> float: ...


@dataclass
class _Trial:
    spec: TrialRun
    seq: int
    t1: float
    model: RuntimeModel
    it: float
    stops: list[int]
    width: Fraction = Fraction(1)
    gpus: tuple[str, ...] = ()
    packed: bool = False
    pause_until: float = 0.0

    def h1(self, horizon: Horizon = "rung") -> float:
        end = self.stops[0] if horizon == "rung" else self.spec.budget
        return (end - self.it) * self.t1


@dataclass(frozen=True, slots=True)
class Placed:
    """A trial (re)started on GPUs: a packed lane on one GPU, or a gang of whole GPUs."""

    time: float
    trial_id: str
    gpus: tuple[str, ...]
    packed: bool


@dataclass
class TuningResult:
    algorithm: str
    executor: str
    gpus: int
    makespan: float
    time_to_target: float | None
    gpu_seconds: float
    utilisation: float  # mean SM busy share over the pool and the makespan
    best_score: float
    trials: int
    groups: int
    peak_trials_per_gpu: int = 0  # most trials that ever ran on one GPU at the same time


@dataclass
class TuningSim:
    cluster: Cluster
    pool: list[str]
    trials_model: TrialModel
    algorithm: TuningAlgorithm
    executor: Executor = "fluid"
    fluid: FluidConfig = field(default_factory=FluidConfig)
    sensitivity: Sensitivity = field(default_factory=Sensitivity)
    horizon: Horizon = "rung"
    observe: Observe = "iteration"
    now: float = 0.0
    # GPUs to size new-trial admission by while the pool is empty (a tuning App waiting for its first
    # lease): an asynchronous algorithm then still submits the trials it would run on the GPUs it asks
    # for, so its demand and remaining work are real in the bids that decide whether it gets any.
    idle_capacity_gpus: int = 0
    _running: dict[str, _Trial] = field(default_factory=dict, init=False)
    _pending: list[_Trial] = field(default_factory=list, init=False)
    _lanes: dict[str, list[str]] = field(default_factory=dict, init=False)  # GPU → packed trial ids
    _seq: int = field(default=0, init=False)
    _gpu_s: float = field(default=0.0, init=False)
    _busy: float = field(default=0.0, init=False)
    _pool_s: float = field(default=0.0, init=False)
    _ttt: float | None = field(default=None, init=False)
    _best: float = field(default=-math.inf, init=False)
    _groups: int = field(default=0, init=False)
    _trials: int = field(default=0, init=False)
    _end: float = field(default=0.0, init=False)
    placements: list[Placed] = field(default_factory=list, init=False)
    _work_done: float = field(default=0.0, init=False)
    _started: set[int] = field(default_factory=set, init=False)
    _peak_per_gpu: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.executor not in ("fifo", "fluid"):
            raise ValueError(f"executor must be 'fifo' or 'fluid', got {self.executor!r}")
        if self.horizon not in ("rung", "budget"):
            raise ValueError(f"horizon must be 'rung' or 'budget', got {self.horizon!r}")
        if self.observe not in ("iteration", "milestone"):
            raise ValueError(f"observe must be 'iteration' or 'milestone', got {self.observe!r}")
        for g in self.pool:
            self.cluster.gpu(g)
        self.pool = self.cluster.sorted(self.pool)

    # --- public ---------------------------------------------------------------------------------

    def done(self) -> bool:
        return self.algorithm.finished() and not self._running and not self._pending

    def run(self, horizon: float = math.inf) -> TuningResult:
        self.advance(horizon)
        if not self.done():
            raise RuntimeError(f"{self.algorithm.name} did not finish within {horizon} s of simulated time")
        return self.result()

    def result(self) -> TuningResult:
        span = self._end
        return TuningResult(
            algorithm=self.algorithm.name,
            executor=self.executor,
            gpus=len(self.pool),
            makespan=span,
            time_to_target=self._ttt,
            gpu_seconds=self._gpu_s,
            utilisation=self._busy / self._pool_s if self._pool_s > 0 else 0.0,
            best_score=self._best,
            trials=self._trials,
            groups=self._groups,
            peak_trials_per_gpu=self._peak_per_gpu,
        )

    def demand(self) -> int:
        """GPUs the job could use now (for a Themis bid): whole GPUs asked by running and waiting trials."""
        return sum(max(1, int(t.width)) for t in [*self._running.values(), *self._pending])

    def live_heights(self) -> list[tuple[float, RuntimeModel]]:
        """(remaining single-GPU seconds to the trial's budget, its runtime model) of every running or
        waiting trial: what a bid or a remaining-work estimate is made of."""
        return [((t.spec.budget - t.it) * t.t1, t.model) for t in [*self._running.values(), *self._pending]]

    def used_gpus(self) -> set[str]:
        """GPUs that running trials occupy (lanes or gangs)."""
        return {g for t in self._running.values() for g in t.gpus}

    def work_done(self) -> float:
        """Serial GPU-seconds of trial iterations completed so far (single-GPU speed)."""
        return self._work_done

    def next_event_time(self) -> float:
        """Absolute time of the next trial milestone or resume (math.inf when nothing runs)."""
        dt = self._next_event()
        return math.inf if dt is None else self.now + dt

    def set_pool(self, gpus: list[str]) -> None:
        """The lease changed. Trials lose revoked GPUs (a gang shrinks, a trial with none waits, keeping
        its progress); new GPUs are free for the next plan (DynamicFluid's cluster-change trigger)."""
        new = set(gpus)
        for g in gpus:
            self.cluster.gpu(g)
        for t in sorted(self._running.values(), key=lambda t: t.seq):
            keep = tuple(g for g in t.gpus if g in new)
            if keep == t.gpus:
                continue
            self._release(t)
            if keep and not t.packed:
                t.width = Fraction(len(keep))
                self._start(t, keep, packed=False)
                t.pause_until = self.now + self.fluid.epsilon  # a gang change is a reconfiguration
            else:
                t.gpus, t.packed = (), False
                self._pending.insert(0, t)
        self.pool = self.cluster.sorted(new)
        if self.executor == "fluid":
            # Trials that never started were planned for the old GPU set: plan them again on the idle
            # GPUs of the new one (the cluster-change trigger, Fluid §3.4.3).
            fresh = [t for t in self._pending if t.it == t.spec.start and t.seq not in self._started]
            if fresh:
                rest = [t for t in self._pending if t not in fresh]
                self._set_static_widths(fresh)
                self._pending = rest + fresh
        self._plan()

    def advance(self, until: float) -> None:
        self._launch()
        while not self.done():
            dt = self._next_event()
            if dt is None:
                if not self.algorithm.finished() and not self._pending and self.pool:
                    raise RuntimeError(
                        f"{self.algorithm.name} is waiting for nothing: no trial runs or waits"
                    )
                dt = math.inf  # waiting for GPUs
            if self.now + dt > until + _TOL * max(1.0, abs(until)):  # due within rounding: handle it now
                if math.isfinite(until):
                    self._progress(until - self.now)
                    self.now = until
                return
            self._progress(dt)
            self.now += dt
            self._handle_stops()
            self._launch()

    # --- time -----------------------------------------------------------------------------------

    def _iter_time(self, t: _Trial) -> float:
        if t.packed:
            p = len(self._lanes[t.gpus[0]])
            return t.t1 * t.model.alpha ** (p - 1)
        w = len(t.gpus)
        return t.model.height(t.t1, w) * self.cluster.slowdown(t.gpus, self.sensitivity)

    def _next_event(self) -> float | None:
        best: float | None = None
        for t in self._running.values():
            if t.pause_until > self.now + _TOL:
                dt = t.pause_until - self.now
            else:
                dt = (t.stops[0] - t.it) * self._iter_time(t)
            best = dt if best is None else min(best, dt)
        return None if best is None else max(0.0, best)

    def _progress(self, dt: float) -> None:
        if dt <= 0:
            return
        util: dict[str, float] = {}
        for t in self._running.values():
            active = dt
            if t.pause_until > self.now:
                active = max(0.0, dt - (t.pause_until - self.now))
            it_time = self._iter_time(t)
            before = t.it
            t.it = min(t.stops[0], t.it + active / it_time)
            if self.observe == "iteration" and active > 0:
                self._observe_iterations(t, before, self.now + (dt - active), it_time)
            self._work_done += (t.it - before) * t.t1
            share = self.trials_model.gpu_util * t.t1 / (it_time * len(t.gpus)) * (active / dt)
            for g in t.gpus:
                util[g] = util.get(g, 0.0) + share
        self._gpu_s += dt * len(util)
        self._busy += dt * sum(min(1.0, u) for u in util.values())
        self._pool_s += dt * len(self.pool)
        self._end = self.now + dt

    def _observe_iterations(self, t: _Trial, before: float, resumed: float, it_time: float) -> None:
        """Scores at the whole iterations completed strictly before the next milestone (which
        `_handle_stops` reports), at the instant each one completed."""
        first = math.floor(before + _TOL) + 1
        last = math.floor(t.it + _TOL)
        for k in range(first, min(last, t.stops[0] - 1) + 1):
            self._see(self.trials_model.score(t.spec, k), resumed + (k - before) * it_time)

    def _see(self, score: float, at: float) -> None:
        self._best = max(self._best, score)
        if score >= self.trials_model.target and (self._ttt is None or at < self._ttt):
            self._ttt = at

    def _handle_stops(self) -> None:
        for t in sorted(self._running.values(), key=lambda t: t.seq):
            if t.pause_until > self.now + _TOL or t.stops[0] - t.it > _TOL * max(1.0, t.stops[0]):
                continue
            t.it = stop = t.stops.pop(0)
            score = self.trials_model.score(t.spec, stop)
            self._see(score, self.now)
            decision = self.algorithm.on_result(Result(t.spec.trial_id, stop, score, self.now))
            if stop >= t.spec.budget or decision == Decision.STOP:
                self._release(t)
                self.algorithm.on_trial_end(t.spec.trial_id, self.now)

    # --- admission and planning -----------------------------------------------------------------

    def _capacity(self) -> int:
        per_gpu = self.fluid.c if self.executor == "fluid" else 1
        return per_gpu * (len(self.pool) or self.idle_capacity_gpus)

    def _launch(self) -> None:
        slots = self._capacity() - len(self._running) - len(self._pending)
        for group in self.algorithm.next_groups(max(0, slots), self.now):
            self._groups += 1
            new = []
            for spec in group.trials:
                self._trials += 1
                self._seq += 1
                stops = sorted({*spec.milestones, spec.budget})
                t = _Trial(
                    spec,
                    self._seq,
                    self.trials_model.iteration_time(spec),
                    self.trials_model.runtime_model(spec),
                    float(spec.start),
                    stops,
                )
                new.append(t)
            if self.executor == "fluid" and new:
                self._set_static_widths(new)
            self._pending.extend(new)
        self._plan()

    def _set_static_widths(self, trials: list[_Trial]) -> None:
        """StaticFluid (Alg. 3.1) widths for trials that have not started, on the idle GPUs.

        With none idle (only open lanes left), every ⌊h/Σh·n⌋ is 0 and Eq. B.1 maps it to 1/c: the
        group packs into the open lanes instead of queueing for a whole GPU that is not there.
        """
        idle = len(self._free())
        hs = [t.h1(self.horizon) for t in trials]
        widths = static_widths(hs, idle, self.fluid) if idle else [Fraction(1, self.fluid.c)] * len(trials)
        for t, w in zip(trials, widths, strict=True):
            t.width = w
        trials.sort(key=lambda t: (-t.width, -t.h1(self.horizon)))

    def _free(self) -> list[str]:
        used = {g for t in self._running.values() for g in t.gpus}
        return [g for g in self.pool if g not in used]

    def _release(self, t: _Trial) -> None:
        self._running.pop(t.spec.trial_id, None)
        if t.packed:
            lane = self._lanes.get(t.gpus[0], [])
            if t.spec.trial_id in lane:
                lane.remove(t.spec.trial_id)
            if not lane:
                self._lanes.pop(t.gpus[0], None)

    def _start(self, t: _Trial, gpus: tuple[str, ...], packed: bool) -> None:
        t.gpus, t.packed = gpus, packed
        self._started.add(t.seq)
        self.placements.append(Placed(self.now, t.spec.trial_id, gpus, packed))
        if packed:
            self._lanes.setdefault(gpus[0], []).append(t.spec.trial_id)
        self._running[t.spec.trial_id] = t
        per_gpu: dict[str, int] = {}
        for r in self._running.values():
            for g in r.gpus:
                per_gpu[g] = per_gpu.get(g, 0) + 1
        self._peak_per_gpu = max(self._peak_per_gpu, *per_gpu.values())

    def _plan(self) -> None:
        if self.executor == "fifo":
            free = self._free()
            while free and self._pending:
                self._start(self._pending.pop(0), (free.pop(0),), packed=False)
            return
        self._admit_fluid()
        if not self._pending and self.fluid.dynamic and self._free():
            self._rescale()

    def _admit_fluid(self) -> None:
        if not self._pending or not self.pool:
            return
        free = self._free()
        c = self.fluid.c
        open_lanes = {
            g: [PackedLane(g, tid, 0, 100 // c) for tid in ids]
            for g, ids in self._lanes.items()
            if len(ids) < c
        }
        widths = [
            t.width if t.width < 1 else Fraction(min(int(t.width), max(1, len(free)))) for t in self._pending
        ]
        demands = [TrialDemand(t.spec.trial_id, t.h1(self.horizon)) for t in self._pending]
        plan = place(self.cluster, [*free, *open_lanes], demands, widths, c, existing_lanes=open_lanes)
        by_id = {t.spec.trial_id: t for t in self._pending}
        for tid, gpus in plan.gangs.items():
            t = by_id.pop(tid)
            t.width = Fraction(len(gpus))
            self._start(t, gpus, packed=False)
        for g, lanes in plan.lanes.items():
            for lane in lanes:
                if lane.trial_id in by_id:
                    self._start(by_id.pop(lane.trial_id), (g,), packed=True)
        self._pending = [t for t in self._pending if t.spec.trial_id in by_id]

    def _current_width(self, t: _Trial) -> Fraction:
        if t.packed:
            return Fraction(1, self.fluid.c) if len(self._lanes[t.gpus[0]]) > 1 else Fraction(1)
        return Fraction(len(t.gpus))

    def _rescale(self) -> None:
        trials = sorted(self._running.values(), key=lambda t: t.seq)
        if not trials:
            return
        current = [self._current_width(t) for t in trials]
        plan = dynamic_rescale(
            current,
            [t.h1(self.horizon) for t in trials],
            len(self.pool),
            self.fluid,
            [t.model for t in trials],
        )
        for r in plan:
            t, free = trials[r.index], self._free()
            if r.rule == Rule.SCALE_UP and free:
                sharing = t.packed and r.current < 1
                base = 0 if sharing else int(r.current)
                target = Fraction(min(int(r.proposed), base + len(free)))
                if (
                    target <= r.current
                    or rescale_rule(t.h1(self.horizon), r.current, target, t.model, self.fluid.epsilon)
                    != Rule.SCALE_UP
                ):
                    continue
                own = () if sharing else t.gpus
                extra = choose_gang(self.cluster, free, int(target) - len(own))
                self._release(t)
                t.packed, t.width = False, target
                self._start(t, (*own, *extra), packed=False)
                t.pause_until = self.now + self.fluid.epsilon
                log.debug("t=%.1f %s scale-up %s -> %s", self.now, t.spec.trial_id, r.current, target)
            elif r.rule == Rule.SCALE_DOWN and r.proposed >= 1 and not t.packed:
                self._release(t)
                t.width = r.proposed
                self._start(t, t.gpus[: int(r.proposed)], packed=False)
                t.pause_until = self.now + self.fluid.epsilon
