"""The AlpaServe placement/queueing simulation: build a workload, run each placement policy, report.

Adapter only: placements come from ``tessera.policy.serving`` (AlpaServe's Algorithm 2, Selective
Replication, Clockwork++) and every request goes through the same shortest-queue dispatcher the router
runs. Following the authors' code (alpa-projects/mms), a policy plans on one sample of the traffic and is scored on a fresh sample from the
same distribution (Clockwork++ is the exception: an oracle on the scored trace's own windows).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tessera.policy.serving.alpaserve import (
    ModelProfile,
    SearchOptions,
    SimStats,
    Workload,
    place,
    simulate,
    validate,
)
from tessera.policy.serving.baselines.clockwork_pp import clockwork_pp_schedule, simulate_schedule
from tessera.policy.serving.baselines.selective_replication import selective_replication
from tessera.sim.serving.arrivals import gamma_arrivals

log = logging.getLogger(__name__)

POLICIES = ("alpaserve", "selective-replication", "clockwork++")


@dataclass(frozen=True)
class PolicyReport:
    policy: str
    attainment: float  # SLO attainment = finish rate within SLO
    goodput_rps: float  # requests served within SLO per second
    gpus_used: int  # devices that hold at least one model
    mean_latency_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    requests: int
    search_s: float
    placement: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def power_law_rates(names: Sequence[str], total: float, exponent: float = 0.5) -> dict[str, float]:
    """The skewed split of AlpaServe §6.3: rate_i ∝ (i+1)^−exponent; exponent 0 is uniform."""
    w = np.array([(i + 1) ** -exponent for i in range(len(names))])
    return {m: float(total * x / w.sum()) for m, x in zip(names, w, strict=True)}


def gamma_workload(
    rates: Mapping[str, float],
    cv: float,
    duration_s: float,
    slo_s: Mapping[str, float],
    rng: np.random.Generator,
) -> Workload:
    """One Gamma(rate, CV) stream per model (``gen_train_workload`` in the authors' code), merged."""
    streams = {m: gamma_arrivals(r, cv, duration_s, rng) if r > 0 else np.zeros(0) for m, r in rates.items()}
    return Workload.from_streams(streams, slo_s)


def report(policy: str, stats: SimStats, gpus_used: int, search_s: float, placement: str) -> PolicyReport:
    lat = stats.latencies
    horizon = max(stats.workload.duration_s, 1e-9)
    pct = np.percentile(lat, [50, 90, 99]) if len(lat) else np.full(3, np.inf)
    return PolicyReport(
        policy=policy,
        attainment=stats.attainment,
        goodput_rps=float(stats.good.sum()) / horizon,
        gpus_used=gpus_used,
        mean_latency_s=stats.mean_latency,
        p50_s=float(pct[0]),
        p90_s=float(pct[1]),
        p99_s=float(pct[2]),
        requests=len(stats.workload),
        search_s=search_s,
        placement=placement,
    )


def run_policies(
    profiles: Sequence[ModelProfile],
    num_devices: int,
    plan_workload: Workload,
    eval_workload: Workload,
    budget_bytes: float,
    *,
    policies: Sequence[str] = POLICIES,
    options: SearchOptions | None = None,
    clockwork_window_s: float = 60.0,
    on_step: Callable[[int, int], None] | None = None,
) -> list[PolicyReport]:
    """Place with each policy on ``plan_workload``; score on ``eval_workload``."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown placement policies {unknown}; choose from {list(POLICIES)}")
    opts = options or SearchOptions()
    by_name = {p.name: p for p in profiles}
    out = []
    for policy in policies:
        t0 = time.perf_counter()
        if policy == "alpaserve":
            plm = place(profiles, num_devices, plan_workload, budget_bytes, opts, on_step=on_step).placement
        elif policy == "selective-replication":
            plm = selective_replication(
                profiles, num_devices, plan_workload, budget_bytes, memory_rule=opts.memory_rule
            ).placement
        else:
            sched = clockwork_pp_schedule(
                profiles, num_devices, eval_workload, budget_bytes, clockwork_window_s,
                memory_rule=opts.memory_rule,
            )  # fmt: skip
            search_s = time.perf_counter() - t0
            for p in sched.placements:
                validate(p, by_name, budget_bytes, num_devices=num_devices, rule=opts.memory_rule)
            stats = simulate_schedule(sched, profiles, eval_workload, fixed_overhead_s=opts.fixed_overhead_s)
            used = max(sum(1 for g in p.groups if g.models) for p in sched.placements)
            out.append(report(policy, stats, used, search_s, f"{len(sched.placements)} windows"))
            continue
        search_s = time.perf_counter() - t0
        validate(plm, by_name, budget_bytes, num_devices=num_devices, rule=opts.memory_rule)
        stats = simulate(plm, by_name, eval_workload, fixed_overhead_s=opts.fixed_overhead_s)
        used = sum(len(g.devices) for g in plm.groups if g.models)
        out.append(report(policy, stats, used, search_s, plm.describe()))
        log.info("%s: attainment %.4f in %.2fs search", policy, stats.attainment, search_s)
    return out
