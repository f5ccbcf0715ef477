"""Symphony scheduler throughput: requests scheduled per second on one core across 1-1,000 GPUs
(target ≥ 100,000/s; Symphony §5.5 reports 12 M req/s with 32 C++ threads), then Symphony's
goodput against eager batching from light load to 2× overload.

Run: .venv/bin/python tests/bench/bench_symphony.py [--repeats 5] [--requests 30000] [--loads 0.6,2.0]

Throughput: 10 identical models (α = 1 ms, β = 10 ms, SLO = 36 ms, the Fig. 6a shape) at each ``--loads``
fraction of the staggered capacity of N GPUs, ~30,000 Poisson requests. Only scheduler calls (enqueue /
advance / next_timer / take_drops) are inside the timed loop. Each figure is requests / CPU seconds of this
process (``time.process_time``: the one core's work, unaffected by other processes taking the core away
on a shared machine), the median of ``--repeats`` runs taken round-robin over the policies; the wall-clock
rate of the same runs is printed beside it. Side by side: ``symphony`` = deferred with the early-drop
GETBATCH (what the operator configures; its target from each model's metered rate), ``clusterGpus`` = the same
with the target over every GPU (no rate meter), ``headGreedy`` = deferred with the head-greedy GETBATCH,
``before`` = the scheduler as it was before the throughput work (``tests/unit/serving_symphony/
symphony_reference.py``, same decisions as headGreedy), eager dispatch in the same framework (k = 0) and
Clockwork's earliest-LEM rule (A.11.2), which scans every GPU on each arrival.

Goodput (``--goodput-only`` skips the throughput part): 4 identical models (α = 1 ms, β = 15 ms, SLO = 2ℓ(8) = 46 ms), 8 GPUs, 2 s of Poisson arrivals per
point, seed 2; offered load as a multiple of Symphony's peak (highest rate with ≤ 1 % bad rate, bisection
Symphony §3.4); goodput = requests finished by their deadline per second. ``eager`` is Symphony's scheduler
with deferral off and the same early-drop GETBATCH (Symphony §3.4's eager); ``eager-headgreedy`` the eager
reported here before, with the head-greedy GETBATCH.

``--per-model`` adds the same 4 models' goodput by the Fig. 7a criterion (every model's p99 within its SLO
after a 2 s warm-up, 3 seeds pooled, 10 s and 20 s measured; ``cluster_sim.per_model_goodput``) for
Symphony and eager, both on the early-drop GETBATCH. ``--autoscale`` adds the autoscaling loop
(``cluster_sim.autoscale``, Symphony §3.5's advice after each 1 s epoch) on the unit test's setup: the same 4
models at 1,500 req/s from 16 GPUs, release damping 1 (the paper's rule) and 0.5, per GETBATCH.
``--partition`` adds the sharding partitioner (``symphony/partition.py``; Symphony Appendix A): seeded random
models (rate log-normal, static memory 0.1-2, dynamic 0-0.5, as ``test_partition.py``) split 200 into 10 and
800 into 20, with the CPU time taken and the imbalance (max − min)/avg of load and memory beside the random-search
baseline's best of as many tries as fit in the same CPU time. ``--only`` runs just the parts asked for with
these options."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tessera.policy.serving.common import ClusterScheduler, Request
from tessera.progress import Progress
from tessera.sim.serving.cluster_sim import (
    ServedModel,
    autoscale,
    identical_models,
    make_cluster_requests,
    make_scheduler,
    max_goodput,
    per_model_goodput,
    run_policy,
    staggered_capacity,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.unit.serving_symphony.symphony_reference import ReferenceSymphonyScheduler

GPUS = (1, 10, 100, 1_000)
POLICIES = ("symphony", "clusterGpus", "headGreedy", "before", "eager", "clockwork")
GOODPUT_LOADS = (0.2, 0.5, 0.8, 1.0, 1.25, 1.5, 2.0)


def factory(policy: str, models: list[ServedModel], n: int) -> Callable[[], ClusterScheduler]:
    if policy == "before":
        return lambda: ReferenceSymphonyScheduler({m.name: m.profile for m in models}, n)
    if policy == "symphony":
        return lambda: make_scheduler("symphony", models, n, get_batch="earlyDropForTarget")
    if policy == "clusterGpus":
        return lambda: make_scheduler(
            "symphony", models, n, get_batch="earlyDropForTarget", target_batch="clusterGpus"
        )
    if policy == "headGreedy":
        return lambda: make_scheduler("symphony", models, n)
    return lambda: make_scheduler(policy, models, n)


def drive(s: ClusterScheduler, reqs: list[Request]) -> tuple[float, float, int]:
    """CPU seconds and wall seconds spent in the scheduler loop, and batches dispatched."""
    batches = 0
    c0, t0 = time.process_time(), time.perf_counter()
    i = 0
    while True:
        ta = reqs[i].arrival if i < len(reqs) else math.inf
        nt = s.next_timer()
        tt = math.inf if nt is None else nt
        if ta == math.inf and tt == math.inf:
            break
        if tt < ta:
            batches += len(s.advance(tt))
        else:
            batches += len(s.advance(ta, strictly_before=True))
            s.enqueue(reqs[i], ta)
            i += 1
            batches += len(s.advance(ta))
        s.take_drops()
    return time.process_time() - c0, time.perf_counter() - t0, batches


def throughput(args: argparse.Namespace, loads: list[float]) -> None:
    models = identical_models(10, alpha=0.001, beta=0.010, slo=0.036)
    rows = []
    with Progress(len(loads) * len(GPUS) * len(POLICIES) * args.repeats, "throughput", enabled=True) as p:
        done = 0
        for load in loads:
            for n in GPUS:
                rate = load * staggered_capacity(models, n)
                reqs = make_cluster_requests(models, rate, args.requests / rate, np.random.default_rng(0))
                cpu: dict[str, list[float]] = {pol: [] for pol in POLICIES}
                wall: dict[str, list[float]] = {pol: [] for pol in POLICIES}
                for _ in range(args.repeats):
                    for pol in POLICIES:
                        c, w, _ = drive(factory(pol, models, n)(), reqs)
                        cpu[pol].append(len(reqs) / c)
                        wall[pol].append(len(reqs) / w)
                        done += 1
                        p.update(done)
                row = {pol: statistics.median(v) for pol, v in cpu.items()}
                wrow = {pol: statistics.median(v) for pol, v in wall.items()}
                rows.append((load, n, len(reqs), rate, row, wrow, os.getloadavg()[0]))
    print("requests scheduled per CPU second of one core (wall-clock rate of the same runs in brackets)")
    print(f"{'load':>5} {'GPUs':>6} {'requests':>9} {'offered r/s':>11} "
          + " ".join(f"{p:>22}" for p in POLICIES) + f" {'sym/before':>10} {'loadavg':>7}")  # fmt: skip
    for load, n, nreq, rate, row, wrow, la in rows:
        print(
            f"{load:>5.1f} {n:>6} {nreq:>9} {rate:>11.0f} "
            + " ".join(f"{row[p]:>10,.0f} ({wrow[p]:>9,.0f})" for p in POLICIES)
            + f" {row['symphony'] / row['before']:>10.2f} {la:>7.2f}"
        )  # fmt: skip
    worst = min(r[4]["symphony"] for r in rows)
    print(
        f"medians of {args.repeats} runs; loadavg = 1-minute load average after the row on {os.cpu_count()} CPUs"
    )
    print(f"target >= 100,000 req/s on one core at 1-1,000 GPUs: {'met' if worst >= 100_000 else 'NOT met'}"
          f" (worst {worst:,.0f} req/s of CPU time)")  # fmt: skip


def goodput() -> None:
    models = identical_models(4, alpha=0.001, beta=0.015, slo=0.046, max_batch=64)
    n, dur, seed = 8, 2.0, 2
    peak = max_goodput("symphony", models, n, duration=dur, seed=seed, get_batch="earlyDropForTarget")
    early = "earlyDropForTarget"
    peaks = {
        "headGreedy": max_goodput("symphony", models, n, duration=dur, seed=seed),
        "eager": max_goodput("eager", models, n, duration=dur, seed=seed, get_batch=early),
        "eager-headgreedy": max_goodput("eager-headgreedy", models, n, duration=dur, seed=seed),
    }
    print(f"\ngoodput (req/s on time), 8 GPUs; Symphony's peak at <= 1 % bad rate: {peak:,.0f} req/s;"
          f" head-greedy {peaks['headGreedy']:,.0f}, eager (same early-drop GETBATCH) {peaks['eager']:,.0f}"
          f" (symphony/eager {peak / peaks['eager']:.2f}x), eager-headgreedy {peaks['eager-headgreedy']:,.0f}"
          f" (symphony/eager-headgreedy {peak / peaks['eager-headgreedy']:.2f}x)")  # fmt: skip
    print(
        f"{'offered/peak':>12} {'offered r/s':>11} {'symphony':>16} {'headGreedy':>16} {'eager':>16}"
        f" {'eager-headgreedy':>16} {'sym/eager':>9}"
    )
    for f in GOODPUT_LOADS:
        rate = f * peak
        st = {
            "symphony": run_policy(
                "symphony", models, n, rate, duration=dur, seed=seed, get_batch="earlyDropForTarget"
            ),
            "headGreedy": run_policy("symphony", models, n, rate, duration=dur, seed=seed),
            "eager": run_policy("eager", models, n, rate, duration=dur, seed=seed, get_batch=early),
            "eager-headgreedy": run_policy("eager-headgreedy", models, n, rate, duration=dur, seed=seed),
        }
        cells = " ".join(f"{st[k].goodput:>7,.0f} ({st[k].bad_rate:>5.1%})" for k in st)
        print(f"{f:>12.2f} {rate:>11,.0f} {cells} {st['symphony'].goodput / st['eager'].goodput:>9.2f}")
    print("(bad rate: dropped or late / offered)")


def per_model() -> None:
    models = identical_models(4, alpha=0.001, beta=0.015, slo=0.046, max_batch=64)
    early = "earlyDropForTarget"
    print("\nper-model p99 goodput (req/s), 8 GPUs, 2 s warm-up, seeds 0-2 pooled:")
    for measure in (10.0, 20.0):
        g = {
            p: per_model_goodput(p, models, 8, measure=measure, warmup=2.0, seeds=[0, 1, 2], get_batch=early)
            for p in ("symphony", "eager")
        }
        print(f"  {measure:g} s measured: symphony {g['symphony']:,.0f}, eager {g['eager']:,.0f}, "
              f"symphony/eager {g['symphony'] / g['eager']:.2f}x", flush=True)  # fmt: skip


def autoscaling() -> None:
    models = identical_models(4, alpha=0.001, beta=0.015, slo=0.046)
    print(
        "\nautoscaling, 1,500 req/s from 16 GPUs, 1 s epochs, seed 3 (GPUs per epoch, bad rate in brackets):"
    )
    for gb in ("headGreedy", "earlyDropForTarget"):
        for damping in (1.0, 0.5):
            steps = autoscale(
                "symphony", models, 1500.0, 16, epochs=6, duration=1.0, seed=3, release_damping=damping,
                get_batch=gb,
            )  # fmt: skip
            path = " -> ".join(f"{s.n_gpus} ({s.bad_rate:.1%})" for s in steps)
            print(f"  {gb}, damping {damping:g}: {path}", flush=True)


def partitioning() -> None:
    import random

    from tessera.policy.serving.symphony.partition import ShardModel, partition_models, random_partition

    print("\npartitioning (CPU seconds; imbalance of load / memory, random search in the same CPU time):")
    for n, parts in ((200, 10), (800, 20)):
        rng = random.Random(0)
        models = [
            ShardModel(f"m{i}", rng.lognormvariate(3, 1), rng.uniform(0.1, 2.0), rng.uniform(0.0, 0.5))
            for i in range(n)
        ]
        c0 = time.process_time()
        p = partition_models(models, parts)
        took = time.process_time() - c0
        c0, tries, best = time.process_time(), 0, None
        r = random.Random(1)
        while time.process_time() - c0 < took:
            cand = random_partition(models, parts, r, tries=10)
            tries += 10
            if cand is not None and (best is None or sum(cand.imbalance()) < sum(best.imbalance())):
                best = cand
        li, mi = p.imbalance()
        rnd = f"{best.imbalance()[0]:.3f} / {best.imbalance()[1]:.3f}" if best else "none feasible"
        print(
            f"  {n} models into {parts}: {took:.1f} s, imbalance {li:.3f} / {mi:.3f}; random ({tries} tries) {rnd}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs per point; the median is reported")
    ap.add_argument("--requests", type=int, default=30_000, help="requests per run (approximate)")
    ap.add_argument("--loads", default="0.6,2.0", help="offered load / staggered capacity, comma-separated")
    ap.add_argument("--goodput-only", action="store_true", help="skip the scheduler-throughput part")
    ap.add_argument("--per-model", action="store_true", help="add the per-model p99 goodput of the 4 models")
    ap.add_argument("--autoscale", action="store_true", help="add the autoscaling trajectories")
    ap.add_argument("--partition", action="store_true", help="add the sharding partitioner's figures")
    ap.add_argument(
        "--only", action="store_true", help="with --per-model/--autoscale/--partition: nothing else"
    )
    args = ap.parse_args()
    if not args.only:
        if not args.goodput_only:
            throughput(args, [float(x) for x in args.loads.split(",") if x])
        goodput()
    if args.per_model:
        per_model()
    if args.autoscale:
        autoscaling()
    if args.partition:
        partitioning()


if __name__ == "__main__":
    main()
