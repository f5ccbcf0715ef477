"""Discrete-event simulator of a GPU cluster running training apps under one policy.

Events: app arrivals, an app runtime's own events (a job or phase finishes), lease expiries. After the
events at one instant, if GPUs are free and some app can use more, the policy runs a round on the free
GPUs (a "resource-available event", Themis §4.2.2) and its grants become leases. Each app's GPU
set changes at most once per instant, so a lease renewed onto the same GPUs costs no restart.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from tessera.cluster import Cluster, Sensitivity
from tessera.policy.themis.arbiter import admit
from tessera.policy.themis.bids import make_bid
from tessera.policy.themis.estimate import NAvg, t_id
from tessera.policy.training import AppState, Grant, TrainingPolicy, check_decision
from tessera.sim.training.estimate_error import AppError, MisestimatingEstimator
from tessera.sim.training.runtime import AppRuntime, GangJobsRuntime, Job, SuccessiveHalvingRuntime
from tessera.sim.training.trace import Trace, TraceApp

log = logging.getLogger(__name__)

_ARRIVE, _RUNTIME, _LEASE, _TICK = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class SimConfig:
    # A job whose GPUs change checkpoints (5–10 s, Themis §5: 7.5 s) and its container is removed and
    # added again (35 s median, Themis §6.2.3).
    restart_s: float = 42.5
    admission_threshold: float | None = None  # footnote 2; None = admit everything
    halving_rule: str = "median"  # Eq. 2's current-phase estimate ("median" reproduces Table 3)
    max_time: float = 1e9  # safety stop (simulated seconds)
    round_gap_s: float = 60.0  # rounds at most this often; events in between wait for the next round
    # Fig. 17: each app misestimates its iterations and S by errors drawn uniformly from [−X, X]; 0 = exact.
    estimate_error: float = 0.0
    estimate_error_seed: int = 0
    # Fig. 18: apps that misreport their placement slowdowns, (app id, reported S by locality); their jobs
    # still run at the true S of their trace entry.
    reported_sensitivity: tuple[tuple[str, Sensitivity], ...] = ()

    def __post_init__(self) -> None:
        if self.restart_s < 0:
            raise ValueError(f"restart_s must be >= 0, got {self.restart_s}")
        if self.round_gap_s < 0:
            raise ValueError(f"round_gap_s must be >= 0, got {self.round_gap_s}")
        for entry in self.reported_sensitivity:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Sensitivity)):
                raise ValueError(f"reported_sensitivity entries must be (app id, Sensitivity), got {entry!r}")
        if not 0.0 <= self.estimate_error < 1.0:
            raise ValueError(f"estimate_error must be in [0, 1), got {self.estimate_error}")
        if self.halving_rule not in ("median", "actual"):
            raise ValueError(f"halving_rule must be 'median' or 'actual', got {self.halving_rule!r}")


@dataclass(slots=True)
class AppOutcome:
    app_id: str
    arrival: float
    finish: float
    total_work: float
    peak_demand: int
    n_avg: float
    gpu_seconds: float
    network_intensive: bool
    rho: float  # T_sh / T_id with T_id = T_cluster × N_avg (paper)
    rho_exact: float  # T_id = work / min(R_C / N_avg, demand) (Eq. 1 read as the true 1/N share)
    rejected: bool = False
    # Tuning apps (a `tuning` block): seconds from arrival until a trial first reached the workload's
    # target (None: never), and the best score any trial reported (None: rejected).
    tuning: bool = False
    time_to_target: float | None = None
    best_score: float | None = None


@dataclass(slots=True)
class SimRun:
    policy: str
    apps: list[AppOutcome]
    placement_scores: list[float]
    makespan: float
    gpu_seconds: float
    rounds: int
    events: int
    wall_s: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)
    # (sim time s, app id, ρ_current, GPUs held) for every active app at the start of every round: what the
    # arbiter ranks on (Themis' cached-table rule, §3.3.2; ρ_cap = 1e6 for an app holding nothing).
    rho_timeline: list[tuple[float, str, float, int]] = field(default_factory=list)
    queues: dict[str, Any] = field(default_factory=dict)  # team-queue figures (a `queues:` block)


@dataclass(slots=True)
class _Live:
    spec: TraceApp
    runtime: AppRuntime
    navg: NAvg
    held: set[str] = field(default_factory=set)
    attained: float = 0.0
    since: float = 0.0  # when `held` last changed (for attained service)
    # When the current holding began, the minimum runtime's start: GPUs got after holding none for a while
    # (a lease renewed at the instant it ended continues the holding).
    held_since: float = 0.0
    emptied_at: float = -math.inf  # when it last came to hold no GPU
    version: int = 0
    error: AppError | None = None  # the app's estimation error (SimConfig.estimate_error > 0)
    previous: frozenset[str] = frozenset()  # GPUs whose lease ended since the last round (AppState.previous)


RuntimeFactory = Callable[[TraceApp, Cluster, "SimConfig"], AppRuntime]


def make_runtime(spec: TraceApp, cluster: Cluster, config: SimConfig) -> AppRuntime:
    """The built-in runtime for an app: gang-scheduled jobs, successive halving, or (a `tuning` app) a
    tuning algorithm whose trials Fluid places inside the app's lease."""
    if spec.tuning is not None:
        return _tuning_runtime(spec, cluster, config)
    jobs = [
        Job(
            f"{spec.id}/{k}",
            j.iterations,
            j.iter_time,
            min(j.gpus, len(cluster)),
            spec.sensitivity,
            score=j.score,
        )
        for k, j in enumerate(spec.jobs)
    ]
    if spec.halving is None:
        return GangJobsRuntime(cluster, jobs, config.restart_s)
    from tessera.policy.themis.estimate import HalvingPlan

    plan = HalvingPlan(
        len(jobs),
        spec.halving.iters_per_phase,
        min(spec.halving.job_gpus, len(cluster)),
        spec.halving.eta,
        spec.halving.demand_growth,
    )
    rule: Literal["median", "actual"] = "actual" if config.halving_rule == "actual" else "median"
    return SuccessiveHalvingRuntime(cluster, jobs, plan, config.restart_s, rule)


def _tuning_runtime(spec: TraceApp, cluster: Cluster, config: SimConfig) -> AppRuntime:
    from tessera.sim.tuning.experiments import make_algorithm
    from tessera.sim.tuning.two_level import FluidAppRuntime

    t = spec.tuning
    assert t is not None
    workload = dataclasses.replace(t.workload, seed=t.seed)
    # A trial moved to other GPUs checkpoints and restarts like any job, unless the block sets ε itself.
    fluid = t.fluid if t.epsilon_given else dataclasses.replace(t.fluid, epsilon=config.restart_s)
    return FluidAppRuntime(
        cluster,
        workload,
        make_algorithm(t.algorithm, workload, t.seed, max_budget=t.max_budget, samples=t.samples),
        fluid,
        spec.sensitivity,
        max_gpus=min(t.max_gpus or len(cluster), len(cluster)),
        start=spec.arrival,
    )


def _tuning_outcome(rt: AppRuntime, arrival: float) -> tuple[float | None, float | None]:
    """(time to target from arrival, best score) of a Fluid tuning app; (None, None) for other apps."""
    from tessera.sim.tuning.two_level import FluidAppRuntime

    if not isinstance(rt, FluidAppRuntime):
        return None, None
    r = rt.sim.result()
    return (None if r.time_to_target is None else r.time_to_target - arrival), r.best_score


class _Simulation:
    """The state of one run and its steps. `run` handles one instant at a time: pop its events (arrivals,
    runtime events, lease expiries), let finished apps leave and shrunk apps give GPUs back, run a round of
    the policy if GPUs are free and an app wants more, then hand each app whose GPU set changed its new set."""

    def __init__(
        self,
        policy: TrainingPolicy,
        cluster: Cluster,
        trace: Trace,
        rng: random.Random,
        cfg: SimConfig,
        build_runtime: RuntimeFactory,
        on_progress: Callable[[float], None] | None,
        keep_records: bool,
    ) -> None:
        self.policy, self.cluster, self.rng, self.cfg = policy, cluster, rng, cfg
        self.build_runtime, self.on_progress, self.keep_records = build_runtime, on_progress, keep_records
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        for spec in trace.apps:
            self.push(spec.arrival, _ARRIVE, spec.id)
        self.specs = {s.id: s for s in trace.apps}
        self.reported = dict(cfg.reported_sensitivity)
        self.live: dict[str, _Live] = {}
        self.owner: dict[str, str] = {}
        self.expiry: dict[str, float] = {}
        self.free: set[str] = set(cluster.gpu_ids)
        self.outcomes: list[AppOutcome] = []
        self.scores: list[float] = []
        self.records: list[dict[str, Any]] = []
        self.timeline: list[tuple[float, str, float, int]] = []
        self.rounds = self.events = 0
        self.outstanding = 0  # peak demand of the admitted apps still running
        self.n_total = len(trace.apps)
        self.first_arrival = trace.apps[0].arrival if trace.apps else 0.0
        self.last_finish = self.first_arrival
        self.pending: dict[str, set[str]] = {}  # apps whose GPU set changed this instant → new set
        self.last_round = -math.inf
        self.tick_pending = False
        # A policy that may take GPUs back (team-queue reclaim, preemption) runs rounds with none free.
        self.preempts = bool(getattr(policy, "preempts", False))
        self.queued = hasattr(policy, "queues")
        self.observers: list[Callable[[float, _Simulation], None]] = []

    def push(self, t: float, kind: int, app_id: str, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, app_id, version))

    def run(self) -> None:
        while self.heap:
            now = self.heap[0][0]
            if now > self.cfg.max_time:
                raise RuntimeError(
                    f"simulation passed max_time={self.cfg.max_time}s with {len(self.live)} apps unfinished"
                )
            for observe in self.observers:
                observe(now, self)
            self.pending.clear()
            if self._pop_events(now):
                self._navg_update(now)
            self._release(now)
            self._maybe_round(now)
            self._apply_pending(now)
            if not self.heap and self.live:
                stuck = sorted(self.live)[:5]
                raise RuntimeError(
                    f"simulation stalled at t={now:.0f}s: apps {stuck} can never run on this cluster"
                )

    def result(self, wall_s: float) -> SimRun:
        return SimRun(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            apps=sorted(self.outcomes, key=lambda o: o.app_id),
            placement_scores=self.scores,
            makespan=self.last_finish - self.first_arrival,
            gpu_seconds=sum(o.gpu_seconds for o in self.outcomes),
            rounds=self.rounds,
            events=self.events,
            wall_s=wall_s,
            records=self.records,
            rho_timeline=self.timeline,
        )

    # --- events ---------------------------------------------------------------------------------------

    def _pop_events(self, now: float) -> bool:
        """Handle every event at `now`; True if an app arrived and was admitted."""
        arrived = False
        while self.heap and self.heap[0][0] <= now + 1e-9:
            _, _, kind, app_id, ver = heapq.heappop(self.heap)
            self.events += 1
            if kind == _TICK:
                self.tick_pending = False
            elif kind == _ARRIVE:
                arrived = self._arrive(now, app_id) or arrived
            elif kind == _RUNTIME:
                self._runtime_event(now, app_id, ver)
            elif kind == _LEASE:
                self._lease_expiry(now, app_id)
        return arrived

    def _arrive(self, now: float, app_id: str) -> bool:
        spec = self.specs[app_id]
        rt = self.build_runtime(spec, self.cluster, self.cfg)
        n_gpus = len(self.cluster)
        if not admit(rt.peak_demand(), self.outstanding, n_gpus, self.cfg.admission_threshold):
            self.outcomes.append(_rejected(spec, rt, now))
            return False
        self.outstanding += rt.peak_demand()
        rt.advance(now)
        err = (
            AppError.draw(app_id, self.cfg.estimate_error, self.cfg.estimate_error_seed)
            if self.cfg.estimate_error
            else None
        )
        peers = (
            sum(1 for a in self.live.values() if a.spec.queue == spec.queue)
            if self.queued
            else len(self.live)
        )
        self.live[app_id] = _Live(spec, rt, NAvg(now, peers + 1), since=now, error=err)
        return True

    def _runtime_event(self, now: float, app_id: str, version: int) -> None:
        app = self.live.get(app_id)
        if app is None or version != app.version:
            return  # the app left, or its GPUs changed since this event was scheduled
        app.runtime.advance(now)
        self._reschedule(app)

    def _lease_expiry(self, now: float, app_id: str) -> None:
        app = self.live.get(app_id)
        if app is None:
            return
        gone = {g for g in app.held if self.expiry.get(g, math.inf) <= now + 1e-9}
        if gone:
            new = self.pending.get(app_id, set(app.held)) - gone
            app.previous = app.previous | gone
            self._free_gpus(gone)
            self.pending[app_id] = new
            self._set_held(app, now, set(new))

    # --- GPUs held --------------------------------------------------------------------------------------

    def _free_gpus(self, gpus: Iterable[str]) -> None:
        for g in gpus:
            self.owner.pop(g, None)
            self.expiry.pop(g, None)
            self.free.add(g)

    def _set_held(self, app: _Live, now: float, new: set[str]) -> None:
        app.attained += len(app.held) * (now - app.since)
        app.since = now
        if new and not app.held and now > app.emptied_at + 1e-9:
            app.held_since = now
        if app.held and not new:
            app.emptied_at = now
        app.held = new

    def _reschedule(self, app: _Live) -> None:
        app.version += 1
        t = app.runtime.next_event()
        if math.isfinite(t):
            self.push(t, _RUNTIME, app.spec.id, app.version)

    def _navg_update(self, now: float) -> None:
        """N_avg counts the apps sharing with each app: the cluster's, or its queue's under team queues
        (ρ is then measured against the queue's share)."""
        if not self.queued:
            n = len(self.live)
            for a in self.live.values():
                a.navg.update(now, n)
            return
        per_queue: dict[str, int] = {}
        for a in self.live.values():
            per_queue[a.spec.queue] = per_queue.get(a.spec.queue, 0) + 1
        for a in self.live.values():
            a.navg.update(now, per_queue[a.spec.queue])

    def _release(self, now: float) -> None:
        """Finished apps leave; apps that shrank give back GPUs their jobs no longer use."""
        for app_id in list(self.live):
            app = self.live[app_id]
            if app.runtime.done():
                self.pending.pop(app_id, None)
                self._finish(app, now)
                continue
            spare = len(app.held) - app.runtime.demand()
            if spare > 0:
                used = app.runtime.used_gpus()
                drop = sorted(g for g in app.held if g not in used)[:spare]
                if drop:
                    self._free_gpus(drop)
                    new = set(app.held) - set(drop)
                    self.pending[app_id] = new
                    self._set_held(app, now, new)

    def _apply_pending(self, now: float) -> None:
        """Each app whose GPU set changed at `now` moves its jobs onto the new set (progress resumes)."""
        for app_id, gpus in self.pending.items():
            app = self.live[app_id]
            app.runtime.set_gpus(now, frozenset(gpus))
            self._reschedule(app)

    # --- rounds -----------------------------------------------------------------------------------------

    def _maybe_round(self, now: float) -> None:
        """A round when GPUs are free and an app wants more, at most one per `round_gap_s` (a later tick
        event brings the next one)."""
        hungry = [a for a in self.live.values() if a.runtime.demand() > len(a.held)]
        if not ((self.free or self.preempts) and hungry):
            return
        if now < self.last_round + self.cfg.round_gap_s - 1e-9 and not self._reclaim_due():
            if not self.tick_pending:
                self.tick_pending = True
                self.push(self.last_round + self.cfg.round_gap_s, _TICK, "")
            return
        self._round(now)

    def _reclaim_due(self) -> bool:
        """Team queues owed GPUs now (QueuedPolicy.reclaim_due) take them without waiting for the round gap."""
        due = getattr(self.policy, "reclaim_due", None)
        if due is None:
            return False
        apps = ((a.spec.queue, float(len(a.held)), float(a.runtime.demand())) for a in self.live.values())
        return bool(due(apps, len(self.free)))

    def _round(self, now: float) -> None:
        self.rounds += 1
        self.last_round = now
        states = []
        for a in self.live.values():
            a.runtime.advance(now)
            states.append(self._app_state(a, now))
        free_list = self.cluster.sorted(self.free)
        decision = self.policy.allocate(now, states, self.cluster, free_list, self.rng)
        # After the policy ran, so Themis' estimates for this instant are memo hits in the runtimes.
        for st in states:
            rho = make_bid(st, now, self.cluster, 0).rho_old
            self.timeline.append((now, st.app_id, rho, len(st.held)))
        check_decision(decision, states, free_list)
        for a in self.live.values():
            a.previous = frozenset()  # this round saw them: given back, or to others
        if self.keep_records and decision.record:
            self.records.append(decision.record)
        for app_id, gpus in decision.revoke.items():
            self._revoke(now, app_id, gpus)
        for grant in decision.grants:
            self._lease(now, grant)
        self._wake_for_min_runtime(now)

    def _wake_for_min_runtime(self, now: float) -> None:
        """A tick when a holding that a queue's minimum runtime protects may be taken while an app waits
        (QueuedPolicy.protected_until): nothing else would run a round before a lease ends."""
        until = getattr(self.policy, "protected_until", None)
        if until is None or not self.preempts:
            return
        rows = (
            (
                a.spec.queue,
                len(a.held),
                max(0, a.runtime.demand() - len(a.held)),
                a.held_since,
                a.spec.preemptible,
            )
            for a in self.live.values()
        )
        t = until(now, rows)
        if math.isfinite(t):
            self.push(t, _TICK, "")

    def _app_state(self, a: _Live, now: float) -> AppState:
        """What the policy sees of an app: its estimates scaled by its misestimation, if any."""
        k = a.error.work_factor if a.error else 1.0
        return AppState(
            app_id=a.spec.id,
            arrival=a.spec.arrival,
            demand_max=a.runtime.demand(),
            held=frozenset(a.held),
            sensitivity=self.reported.get(a.spec.id, a.spec.sensitivity),
            total_work=a.runtime.total_work() * k,
            remaining_work=a.runtime.remaining_work(now) * k,
            attained_service=a.attained + len(a.held) * (now - a.since),
            n_avg=a.navg.value(now),
            estimator=MisestimatingEstimator(a.runtime, a.error) if a.error else a.runtime,
            network_intensive=a.spec.network_intensive,
            peak_demand=a.runtime.peak_demand(),
            queue=a.spec.queue,
            since=a.held_since,
            previous=a.previous,
            priority=a.spec.priority,
            preemptible=a.spec.preemptible,
        )

    def _revoke(self, now: float, app_id: str, gpus: Iterable[str]) -> None:
        """GPUs taken back before their lease ends; the app restarts on what it keeps (its checkpoint cost
        is the runtime's restart time)."""
        app = self.live[app_id]
        gone = set(gpus)
        self._free_gpus(gone)
        new = set(self.pending.get(app_id, app.held)) - gone
        self.pending[app_id] = new
        self._set_held(app, now, new)

    def _lease(self, now: float, grant: Grant) -> None:
        app = self.live[grant.app_id]
        new = set(self.pending.get(grant.app_id, app.held)) | set(grant.gpus)
        for g in grant.gpus:
            self.free.discard(g)
            self.owner[g] = grant.app_id
            self.expiry[g] = grant.expiry
        self.pending[grant.app_id] = new
        self._set_held(app, now, new)
        if math.isfinite(grant.expiry):
            self.push(grant.expiry, _LEASE, grant.app_id)

    # --- completion -------------------------------------------------------------------------------------

    def _finish(self, app: _Live, now: float) -> None:
        self._free_gpus(app.held)
        self._set_held(app, now, set())
        del self.live[app.spec.id]
        self.outstanding -= app.runtime.peak_demand()
        self._navg_update(now)
        self.outcomes.append(_finished(app, now, len(self.cluster)))
        self.scores.extend(app.runtime.placement_scores)
        self.last_finish = max(self.last_finish, now)
        if self.on_progress is not None:
            self.on_progress(len(self.outcomes) / max(1, self.n_total))


def _finished(app: _Live, now: float, n_gpus: int) -> AppOutcome:
    rt = app.runtime
    n_avg = app.navg.value(now)
    work = rt.total_work()
    peak = rt.peak_demand()
    t_sh = now - app.spec.arrival
    out = AppOutcome(
        app.spec.id,
        app.spec.arrival,
        now,
        work,
        peak,
        n_avg,
        app.attained,
        app.spec.network_intensive,
        t_sh / t_id(work, n_gpus, peak, n_avg, "paper"),
        t_sh / t_id(work, n_gpus, peak, n_avg, "exact"),
    )
    out.tuning = app.spec.tuning is not None
    out.time_to_target, out.best_score = _tuning_outcome(rt, app.spec.arrival)
    return out


def _rejected(spec: TraceApp, rt: AppRuntime, now: float) -> AppOutcome:
    return AppOutcome(
        spec.id,
        spec.arrival,
        now,
        rt.total_work(),
        rt.peak_demand(),
        1.0,
        0.0,
        spec.network_intensive,
        math.nan,
        math.nan,
        rejected=True,
        tuning=spec.tuning is not None,
    )


def simulate(
    policy: TrainingPolicy,
    cluster: Cluster,
    trace: Trace,
    rng: random.Random,
    config: SimConfig | None = None,
    *,
    on_progress: Callable[[float], None] | None = None,
    keep_records: bool = False,
    runtime_factory: RuntimeFactory | None = None,
    observers: Iterable[Callable[[float, Any], None]] = (),
) -> SimRun:
    """Run the whole trace under `policy`. `on_progress(fraction of apps finished)` is called as it goes.
    `runtime_factory` builds each arriving app's runtime (default `make_runtime`): the hook for an app
    scheduler of one's own (docs/simulate.md, "Plugging in an app scheduler"). Each of `observers` is
    called with (now, the simulation) at every instant, before its events (the team-queue meters)."""
    wall0 = time.perf_counter()
    sim = _Simulation(
        policy,
        cluster,
        trace,
        rng,
        config or SimConfig(),
        runtime_factory or make_runtime,
        on_progress,
        keep_records,
    )
    sim.observers.extend(observers)
    sim.run()
    return sim.result(time.perf_counter() - wall0)
