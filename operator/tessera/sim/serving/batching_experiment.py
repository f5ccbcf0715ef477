"""The Orloj reproduction experiment (seed-orloj §6.6): one dynamic model on one GPU, finish rate of
Orloj and its batching baselines across SLO multiples of the solo-time P99."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tessera.policy.serving.baselines.batching import (
    ClipperScheduler,
    ClockworkScheduler,
    NexusScheduler,
    TimeoutScheduler,
)
from tessera.policy.serving.common import BatchScheduler
from tessera.policy.serving.orloj import CandidateOrder, OrlojConfig, OrlojScheduler
from tessera.sim.serving.dynamic_workload import DynamicModel, make_requests
from tessera.sim.serving.worker_sim import RunStats, simulate_workers

POLICIES = ("orloj", "orloj-edf", "clockwork", "nexus", "clipper", "timeout")


def run_batching(
    model: DynamicModel,
    *,
    slo_multiples: Sequence[float],
    n_requests: int,
    load: float,
    seed: int,
    policies: Sequence[str] = POLICIES,
    cv: float = 1.0,
    on_step: Callable[[], None] | None = None,
) -> dict[float, dict[str, RunStats]]:
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise ValueError(f"unknown batching policies {sorted(unknown)}; choose from {list(POLICIES)}")
    p99 = model.solo_p99(np.random.default_rng(seed + 1))
    rate = load * model.throughput_at(8)
    # Offline profile used as Orloj's prior; online profiling refines it during the run.
    priors: dict[str, list[float]] = {
        a: model.sample(i, 500, np.random.default_rng(seed + 10 + i)).tolist()
        for i, a in enumerate(model.apps)
    }
    ms = model.mean_solo()
    out: dict[float, dict[str, RunStats]] = {}
    for mult in slo_multiples:
        slo = mult * p99
        reqs = make_requests(model, n=n_requests, load=load, slo=slo, rng=np.random.default_rng(seed), cv=cv)
        makers: dict[str, Callable[[], BatchScheduler]] = {
            "orloj": lambda: OrlojScheduler(OrlojConfig(latency=model.latency), priors),
            "orloj-edf": lambda: OrlojScheduler(
                OrlojConfig(latency=model.latency, candidate_order=CandidateOrder.EDF_THEN_LARGEST), priors
            ),
            "clockwork": lambda: ClockworkScheduler(model.latency, ms),
            "nexus": lambda: NexusScheduler(model.latency, ms, slo=slo, rate=rate),  # noqa: B023
            "clipper": lambda: ClipperScheduler(model.latency, ms),
            "timeout": lambda: TimeoutScheduler(model.latency, ms, max_batch=8, max_queue_delay=slo / 4),  # noqa: B023
        }
        out[mult] = {}
        for name in policies:
            out[mult][name] = simulate_workers(
                name, makers[name](), reqs, model.latency, rng=np.random.default_rng(seed + 99)
            )
            if on_step is not None:
                on_step()
    return out
