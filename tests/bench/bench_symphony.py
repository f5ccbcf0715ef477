"""Symphony scheduler throughput: requests scheduled per second on one core across 1-1,000 GPUs
(target ≥ 100,000/s; seed-symphony-orion A.7 / A.13 report 12 M req/s with 32 C++ threads).

Run: .venv/bin/python tests/bench/bench_symphony.py
Each point serves 10 identical models (α = 1 ms, β = 10 ms, SLO = 36 ms, the Fig. 6a shape) at 60 % of the
staggered capacity of N GPUs, ~30,000 Poisson requests; only scheduler calls (enqueue / advance) are
timed. Baselines side by side: eager dispatch in the same framework (k = 0) and Clockwork's
earliest-LEM rule (A.11.2), which scans every GPU on each arrival."""

from __future__ import annotations

import math
import time

import numpy as np
from tessera.policy.serving.common import ClusterScheduler, Request
from tessera.progress import Progress
from tessera.sim.serving.cluster_sim import (
    identical_models,
    make_cluster_requests,
    make_scheduler,
    staggered_capacity,
)

GPUS = (1, 10, 100, 1_000)
POLICIES = ("symphony", "eager", "clockwork")
N_REQUESTS = 30_000


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
    models = identical_models(10, alpha=0.001, beta=0.010, slo=0.036)
    rows = []
    with Progress(len(GPUS) * len(POLICIES), "bench_symphony", enabled=True) as p:
        for k, n in enumerate(GPUS):
            rate = 0.6 * staggered_capacity(models, n)
            reqs = make_cluster_requests(models, rate, N_REQUESTS / rate, np.random.default_rng(0))
            row: dict[str, float] = {}
            for j, pol in enumerate(POLICIES):
                secs, _ = drive(make_scheduler(pol, models, n), reqs)
                row[pol] = len(reqs) / secs
                p.update(k * len(POLICIES) + j + 1)
            rows.append((n, len(reqs), rate, row))
    print(f"{'GPUs':>6} {'requests':>9} {'offered r/s':>11} " + " ".join(f"{p + ' sched r/s':>20}" for p in POLICIES)
          + f" {'sym/eager':>9} {'sym/clockwork':>13} {'growth':>7}")  # fmt: skip
    for i, (n, nreq, rate, row) in enumerate(rows):
        g = "" if i == 0 else f"{rows[i - 1][3]['symphony'] / row['symphony']:.2f}x"
        print(
            f"{n:>6} {nreq:>9} {rate:>11.0f} " + " ".join(f"{row[p]:>20,.0f}" for p in POLICIES)
            + f" {row['symphony'] / row['eager']:>9.2f} {row['symphony'] / row['clockwork']:>13.2f} {g:>7}"
        )  # fmt: skip
    worst = min(r[3]["symphony"] for r in rows)
    print(f"growth = per-request cost relative to the previous row; worst Symphony {worst:,.0f} req/s")
    print(f"target >= 100,000 req/s on one core at 1-1,000 GPUs: {'met' if worst >= 100_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
