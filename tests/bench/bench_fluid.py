"""Planning cost of StaticFluid + placement for 10–10,000 trials on 8–4096 GPUs.

Run: .venv/bin/python tests/bench/bench_fluid.py   (baseline column: FIFO's one-GPU-per-trial assignment)
"""

from __future__ import annotations

import random
import time

from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig, TrialDemand, plan_trial_group
from tessera.progress import Progress

TRIALS = (10, 100, 1000, 10000)
GPUS = (8, 64, 512, 4096)


def main() -> None:
    rng = random.Random(0)
    rows = []
    with Progress(len(TRIALS) * len(GPUS), "bench_fluid", enabled=True) as bar:
        for n in GPUS:
            cluster = Cluster.homogeneous(n // 8, 8)
            for k in TRIALS:
                demands = [TrialDemand(f"t{i}", rng.lognormvariate(5, 1)) for i in range(k)]
                t0 = time.perf_counter()
                plan_trial_group(cluster, cluster.gpu_ids, demands, FluidConfig())
                fluid = time.perf_counter() - t0
                t0 = time.perf_counter()
                _ = dict(zip((d.trial_id for d in demands), cluster.gpu_ids, strict=False))  # FIFO baseline
                fifo = time.perf_counter() - t0
                rows.append((k, n, fluid, fifo))
                bar.update(len(rows))
    print(f"{'trials':>7} {'GPUs':>5} {'fluid ms':>9} {'fifo ms':>8} {'ratio':>8} {'x vs prev size':>14}")
    prev: dict[int, float] = {}
    for k, n, fluid, fifo in rows:
        growth = f"{fluid / prev[n]:.1f}" if n in prev else "-"
        prev[n] = fluid
        print(
            f"{k:>7} {n:>5} {fluid * 1e3:>9.2f} {fifo * 1e3:>8.3f} {fluid / max(fifo, 1e-9):>8.0f} {growth:>14}"
        )


if __name__ == "__main__":
    main()
