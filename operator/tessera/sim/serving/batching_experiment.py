"""The Orloj reproduction experiment (Orloj §5): one dynamic model on one GPU, finish rate of
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


def main(argv: list[str] | None = None) -> int:
    """``python -m tessera.sim.serving.batching_experiment [--modes 2] [--requests 3000] [--static]``:
    the Orloj reproduction table (finish rate per policy and SLO multiple)."""
    import argparse

    from tessera.progress import Progress

    ap = argparse.ArgumentParser(description="Orloj vs batching baselines on a dynamic model (Orloj §5).")
    ap.add_argument("--modes", type=int, default=2, help="modes (applications) on [50, 100] ms")
    ap.add_argument("--static", action="store_true", help="one narrow mode (σ = 0.5 ms): a static model")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--load", type=float, default=0.6, help="fraction of 8/E[L_B(8)]")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--slo", default="1.5,2,3,5", help="SLO multiples of the solo-time P99")
    args = ap.parse_args(argv)
    model = (
        DynamicModel.evenly_spaced(1, sigma=0.0005) if args.static else DynamicModel.evenly_spaced(args.modes)
    )
    mults = [float(x) for x in args.slo.split(",") if x]
    with Progress(len(mults) * len(POLICIES), "batching", enabled=True) as bar:
        n = 0

        def step() -> None:
            nonlocal n
            n += 1
            bar.update(n)

        res = run_batching(
            model, slo_multiples=mults, n_requests=args.requests, load=args.load, seed=args.seed, on_step=step
        )
    print("| SLO (× P99) | " + " | ".join(POLICIES) + " |")
    print("|---" * (len(POLICIES) + 1) + "|")
    for mult, row in res.items():
        print(f"| {mult:g} | " + " | ".join(f"{row[p].finish_rate:.2f}" for p in POLICIES) + " |")
    others = [p for p in POLICIES if p != "orloj"]
    print("\nOrloj's lead (finish rate / the policy's − 1):")
    print("| SLO (× P99) | " + " | ".join(others) + " |")
    print("|---" * (len(others) + 1) + "|")
    for mult, row in res.items():
        o = row["orloj"].finish_rate
        lead = [f"{o / row[p].finish_rate - 1:+.1%}" if row[p].finish_rate else "—" for p in others]
        print(f"| {mult:g} | " + " | ".join(lead) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
