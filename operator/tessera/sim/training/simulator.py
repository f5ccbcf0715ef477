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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tessera.cluster import Cluster, Sensitivity
from tessera.policy.themis.arbiter import admit
from tessera.policy.themis.bids import make_bid
from tessera.policy.themis.estimate import NAvg, t_id
from tessera.policy.training import AppState, TrainingPolicy, check_decision
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


@dataclass(slots=True)
class _Live:
    spec: TraceApp
    runtime: AppRuntime
    navg: NAvg
    held: set[str] = field(default_factory=set)
    attained: float = 0.0
    since: float = 0.0  # when `held` last changed (for attained service)
    version: int = 0
    error: AppError | None = None  # the app's estimation error (SimConfig.estimate_error > 0)


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
) -> SimRun:
    """Run the whole trace under `policy`. `on_progress(fraction of apps finished)` is called as it goes.
    `runtime_factory` builds each arriving app's runtime (default `make_runtime`): the hook for an app
    scheduler of one's own (docs/simulate.md, "Plugging in an app scheduler")."""
    build_runtime = runtime_factory or make_runtime
    import time as _time

    wall0 = _time.perf_counter()
    cfg = config or SimConfig()
    heap: list[tuple[float, int, int, str, int]] = []
    seq = 0

    def push(t: float, kind: int, app_id: str, version: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, app_id, version))

    for spec in trace.apps:
        push(spec.arrival, _ARRIVE, spec.id)
    specs = {s.id: s for s in trace.apps}
    reported = dict(cfg.reported_sensitivity)
    live: dict[str, _Live] = {}
    owner: dict[str, str] = {}
    expiry: dict[str, float] = {}
    free: set[str] = set(cluster.gpu_ids)
    outcomes: list[AppOutcome] = []
    scores: list[float] = []
    records: list[dict[str, Any]] = []
    timeline: list[tuple[float, str, float, int]] = []
    rounds = events = 0
    outstanding = 0
    n_total = len(trace.apps)
    first_arrival = trace.apps[0].arrival if trace.apps else 0.0
    last_finish = first_arrival

    def set_held(app: _Live, now: float, new: set[str]) -> None:
        app.attained += len(app.held) * (now - app.since)
        app.since = now
        app.held = new

    def reschedule(app: _Live) -> None:
        app.version += 1
        t = app.runtime.next_event()
        if math.isfinite(t):
            push(t, _RUNTIME, app.spec.id, app.version)

    def navg_update(now: float) -> None:
        n = len(live)
        for a in live.values():
            a.navg.update(now, n)

    def finish(app: _Live, now: float) -> None:
        nonlocal last_finish, outstanding
        for g in app.held:
            owner.pop(g, None)
            expiry.pop(g, None)
            free.add(g)
        set_held(app, now, set())
        del live[app.spec.id]
        outstanding -= app.runtime.peak_demand()
        navg_update(now)
        rt = app.runtime
        n_avg = app.navg.value(now)
        work = rt.total_work()
        peak = rt.peak_demand()
        t_sh = now - app.spec.arrival
        outcomes.append(
            AppOutcome(
                app.spec.id,
                app.spec.arrival,
                now,
                work,
                peak,
                n_avg,
                app.attained,
                app.spec.network_intensive,
                t_sh / t_id(work, len(cluster), peak, n_avg, "paper"),
                t_sh / t_id(work, len(cluster), peak, n_avg, "exact"),
            )
        )
        outcomes[-1].tuning = app.spec.tuning is not None
        outcomes[-1].time_to_target, outcomes[-1].best_score = _tuning_outcome(rt, app.spec.arrival)
        scores.extend(rt.placement_scores)
        last_finish = max(last_finish, now)
        if on_progress is not None:
            on_progress(len(outcomes) / max(1, n_total))

    pending: dict[str, set[str]] = {}  # apps whose GPU set changed this instant → new set
    last_round = -math.inf
    tick_pending = False

    while heap:
        now = heap[0][0]
        if now > cfg.max_time:
            raise RuntimeError(f"simulation passed max_time={cfg.max_time}s with {len(live)} apps unfinished")
        pending.clear()
        arrived = False
        while heap and heap[0][0] <= now + 1e-9:
            _, _, kind, app_id, ver = heapq.heappop(heap)
            events += 1
            if kind == _TICK:
                tick_pending = False
            elif kind == _ARRIVE:
                spec = specs[app_id]
                rt = build_runtime(spec, cluster, cfg)
                if not admit(rt.peak_demand(), outstanding, len(cluster), cfg.admission_threshold):
                    outcomes.append(
                        AppOutcome(
                            app_id,
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
                    )
                    continue
                outstanding += rt.peak_demand()
                rt.advance(now)
                err = (
                    AppError.draw(app_id, cfg.estimate_error, cfg.estimate_error_seed)
                    if cfg.estimate_error
                    else None
                )
                live[app_id] = _Live(spec, rt, NAvg(now, len(live) + 1), since=now, error=err)
                arrived = True
            elif kind == _RUNTIME:
                app = live.get(app_id)
                if app is None or ver != app.version:
                    continue
                app.runtime.advance(now)
                reschedule(app)
            elif kind == _LEASE:
                app = live.get(app_id)
                if app is None:
                    continue
                gone = {g for g in app.held if expiry.get(g, math.inf) <= now + 1e-9}
                if gone:
                    new = pending.get(app_id, set(app.held)) - gone
                    for g in gone:
                        owner.pop(g, None)
                        expiry.pop(g, None)
                        free.add(g)
                    pending[app_id] = new
                    set_held(app, now, set(new))
        if arrived:
            navg_update(now)
        # Finished apps leave; apps that shrank give back GPUs their jobs no longer use.
        for app_id in list(live):
            app = live[app_id]
            if app.runtime.done():
                pending.pop(app_id, None)
                finish(app, now)
                continue
            spare = len(app.held) - app.runtime.demand()
            if spare > 0:
                used = app.runtime.used_gpus()
                drop = sorted(g for g in app.held if g not in used)[:spare]
                if drop:
                    for g in drop:
                        owner.pop(g, None)
                        expiry.pop(g, None)
                        free.add(g)
                    new = set(app.held) - set(drop)
                    pending[app_id] = new
                    set_held(app, now, new)
        hungry = [a for a in live.values() if a.runtime.demand() > len(a.held)]
        if free and hungry and now < last_round + cfg.round_gap_s - 1e-9:
            if not tick_pending:
                tick_pending = True
                push(last_round + cfg.round_gap_s, _TICK, "")
        elif free and hungry:
            rounds += 1
            last_round = now
            states = []
            for a in live.values():
                a.runtime.advance(now)
                k = a.error.work_factor if a.error else 1.0
                states.append(
                    AppState(
                        app_id=a.spec.id,
                        arrival=a.spec.arrival,
                        demand_max=a.runtime.demand(),
                        held=frozenset(a.held),
                        sensitivity=reported.get(a.spec.id, a.spec.sensitivity),
                        total_work=a.runtime.total_work() * k,
                        remaining_work=a.runtime.remaining_work(now) * k,
                        attained_service=a.attained + len(a.held) * (now - a.since),
                        n_avg=a.navg.value(now),
                        estimator=MisestimatingEstimator(a.runtime, a.error) if a.error else a.runtime,
                        network_intensive=a.spec.network_intensive,
                        peak_demand=a.runtime.peak_demand(),
                    )
                )
            free_list = cluster.sorted(free)
            decision = policy.allocate(now, states, cluster, free_list, rng)
            # After the policy ran, so Themis' estimates for this instant are memo hits in the runtimes.
            for st in states:
                timeline.append((now, st.app_id, make_bid(st, now, cluster, 0).rho_old, len(st.held)))
            check_decision(decision, states, free_list)
            if keep_records and decision.record:
                records.append(decision.record)
            for grant in decision.grants:
                app = live[grant.app_id]
                new = set(pending.get(grant.app_id, app.held)) | set(grant.gpus)
                for g in grant.gpus:
                    free.discard(g)
                    owner[g] = grant.app_id
                    expiry[g] = grant.expiry
                pending[grant.app_id] = new
                set_held(app, now, new)
                if math.isfinite(grant.expiry):
                    push(grant.expiry, _LEASE, grant.app_id)
        for app_id, gpus in pending.items():
            app = live[app_id]
            app.runtime.set_gpus(now, frozenset(gpus))
            reschedule(app)
        if not heap and live:
            stuck = sorted(live)[:5]
            raise RuntimeError(
                f"simulation stalled at t={now:.0f}s: apps {stuck} can never run on this cluster"
            )
    wall = _time.perf_counter() - wall0
    return SimRun(
        policy=getattr(policy, "name", type(policy).__name__),
        apps=sorted(outcomes, key=lambda o: o.app_id),
        placement_scores=scores,
        makespan=last_finish - first_arrival,
        gpu_seconds=sum(o.gpu_seconds for o in outcomes),
        rounds=rounds,
        events=events,
        wall_s=wall,
        records=records,
        rho_timeline=timeline,
    )
