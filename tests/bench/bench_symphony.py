"""Symphony scheduler throughput: requests scheduled per second on one core across 1-1,000 GPUs
(target ≥ 100,000/s; seed-symphony-orion A.7 / A.13 report 12 M req/s with 32 C++ threads).

Run: .venv/bin/python tests/bench/bench_symphony.py [--repeats 5] [--requests 30000]
Each point serves 10 identical models (α = 1 ms, β = 10 ms, SLO = 36 ms, the Fig. 6a shape) at 60 % of the
staggered capacity of N GPUs, ~30,000 Poisson requests; only scheduler calls (enqueue / advance) are
timed, and each figure is the median of ``--repeats`` runs taken round-robin over the policies (so load
from other processes hits them alike; the 1-minute load average is printed with each row). Side by side:
``before`` = the scheduler as it was before the throughput work (``tests/unit/serving_symphony/
symphony_reference.py``, same decisions), eager dispatch in the same framework (k = 0) and Clockwork's
earliest-LEM rule (A.11.2), which scans every GPU on each arrival."""

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
    identical_models,
    make_cluster_requests,
    make_scheduler,
    staggered_capacity,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.unit.serving_symphony.symphony_reference import ReferenceSymphonyScheduler

GPUS = (1, 10, 100, 1_000)
POLICIES = ("symphony", "before", "eager", "clockwork")


def factory(policy: str, models: list[ServedModel], n: int) -> Callable[[], ClusterScheduler]:
    if policy == "before":
        return lambda: ReferenceSymphonyScheduler({m.name: m.profile for m in models}, n)
    return lambda: make_scheduler(policy, models, n)


def drive(s: ClusterScheduler, reqs: list[Request]) -> tuple[float, int]:
    """Seconds spent in scheduler calls and batches dispatched."""
    batches = 0
    t0 = time.perf_counter()
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
    return time.perf_counter() - t0, batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs per point; the median is reported")
    ap.add_argument("--requests", type=int, default=30_000, help="requests per run (approximate)")
    args = ap.parse_args()
    models = identical_models(10, alpha=0.001, beta=0.010, slo=0.036)
    rows = []
    with Progress(len(GPUS) * len(POLICIES) * args.repeats, "bench_symphony", enabled=True) as p:
        done = 0
        for n in GPUS:
            rate = 0.6 * staggered_capacity(models, n)
            reqs = make_cluster_requests(models, rate, args.requests / rate, np.random.default_rng(0))
            runs: dict[str, list[float]] = {pol: [] for pol in POLICIES}
            for _ in range(args.repeats):
                for pol in POLICIES:
                    secs, _ = drive(factory(pol, models, n)(), reqs)
                    runs[pol].append(len(reqs) / secs)
                    done += 1
                    p.update(done)
            row = {pol: statistics.median(v) for pol, v in runs.items()}
            rows.append((n, len(reqs), rate, row, os.getloadavg()[0]))
    print(f"{'GPUs':>6} {'requests':>9} {'offered r/s':>11} " + " ".join(f"{p + ' r/s':>14}" for p in POLICIES)
          + f" {'sym/before':>10} {'sym/eager':>9} {'sym/clockwork':>13} {'growth':>7} {'load':>5}")  # fmt: skip
    for i, (n, nreq, rate, row, load) in enumerate(rows):
        g = "" if i == 0 else f"{rows[i - 1][3]['symphony'] / row['symphony']:.2f}x"
        print(
            f"{n:>6} {nreq:>9} {rate:>11.0f} " + " ".join(f"{row[p]:>14,.0f}" for p in POLICIES)
            + f" {row['symphony'] / row['before']:>10.2f} {row['symphony'] / row['eager']:>9.2f}"
            + f" {row['symphony'] / row['clockwork']:>13.2f} {g:>7} {load:>5.2f}"
        )  # fmt: skip
    worst = min(r[3]["symphony"] for r in rows)
    print(f"medians of {args.repeats} runs; growth = per-request cost relative to the previous row;")
    print(f"load = 1-minute load average after the row on {os.cpu_count()} CPUs")
    print(f"target >= 100,000 req/s on one core at 1-1,000 GPUs: {'met' if worst >= 100_000 else 'NOT met'}"
          f" (worst {worst:,.0f} req/s)")  # fmt: skip


if __name__ == "__main__":
    main()
