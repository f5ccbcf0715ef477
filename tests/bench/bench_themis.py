"""Benchmark: one Themis arbiter round for 10–1000 apps × 64–4096 GPUs, and the simulator's events/s.

    .venv/bin/python tests/bench/bench_themis.py [--quick]

Prints, per size, the round time of Themis next to a baseline round (Gandiva's greedy loop) with their
ratio, and how the cost grows from one size to the next. Target: 1000 apps × 1024 GPUs under 1 s.
"""

from __future__ import annotations

import argparse
import random
import time

from tessera.cluster import Cluster
from tessera.policy.baselines import Gandiva
from tessera.policy.themis import Themis
from tessera.policy.training import AppState, check_decision
from tessera.progress import Progress
from tessera.sim.training.scenario import PRESETS
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import COMPUTE_INTENSIVE, NETWORK_INTENSIVE, GeneratorConfig, generate


class _Est:
    def __init__(self, work: float, demand: int) -> None:
        self.work, self.demand = work, demand

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return float("inf") if gpus <= 0 else self.work * slowdown / min(gpus, self.demand)


def _instance(n_apps: int, n_gpus: int, rng: random.Random) -> tuple[Cluster, list[AppState], list[str]]:
    cluster = Cluster.build([(4, 2)] * (n_gpus // 8), machines_per_rack=8)
    apps = []
    for i in range(n_apps):
        demand = rng.choice((1, 2, 4, 8))
        work = rng.uniform(1e3, 1e5)
        sens = NETWORK_INTENSIVE if rng.random() < 0.5 else COMPUTE_INTENSIVE
        apps.append(
            AppState(
                f"a{i}",
                -rng.uniform(0, 1e4),
                demand,
                frozenset(),
                sens,
                work,
                work * rng.random(),
                0.0,
                rng.uniform(1, 10),
                _Est(work, demand),
            )
        )
    return cluster, apps, cluster.gpu_ids


def _time(policy, cluster, apps, free, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for r in range(repeat):
        t = time.perf_counter()
        d = policy.allocate(0.0, apps, cluster, free, random.Random(r))
        best = min(best, time.perf_counter() - t)
        check_decision(d, apps, free)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller grid")
    args = ap.parse_args()
    apps_grid = [10, 100, 1000]
    gpus_grid = [64, 256, 1024] if args.quick else [64, 256, 1024, 4096]
    sizes = [(a, g) for a in apps_grid for g in gpus_grid]
    rows = []
    with Progress(len(sizes) + 1, "bench themis", enabled=True) as bar:
        for i, (a, g) in enumerate(sizes):
            cluster, apps, free = _instance(a, g, random.Random(a * 7 + g))
            repeat = 3 if a * g <= 100_000 else 1
            t_themis = _time(Themis(), cluster, apps, free, repeat)
            t_base = _time(Gandiva(), cluster, apps, free, repeat)
            rows.append((a, g, t_themis, t_base))
            bar.update(i + 1, f"{a}×{g}")
        cluster = Cluster.build(PRESETS["testbed-64"])
        trace = generate(GeneratorConfig(apps=60, mean_interarrival_s=1200), random.Random(1), 64)
        sims = []
        for pol in (Themis(), Gandiva()):
            r = simulate(pol, cluster, trace, random.Random(1), SimConfig())
            sims.append((r.policy, r.events, r.rounds, r.wall_s))
        bar.update(len(sizes) + 1)
    print("\none arbiter round, all GPUs free (best of up to 3)")
    print(
        f"{'apps':>5} {'GPUs':>5} {'themis s':>9} {'gandiva s':>9} {'ratio':>6} {'growth vs prev GPUs':>20}"
    )
    prev: dict[int, float] = {}
    for a, g, tt, tb in rows:
        growth = f"{tt / prev[a]:.2f}× for {g // prev_g[a]}× GPUs" if a in prev else ""
        print(f"{a:>5} {g:>5} {tt:>9.4f} {tb:>9.4f} {tt / tb:>6.1f} {growth:>20}")
        prev[a] = tt
        prev_g[a] = g
    target = next(tt for a, g, tt, _ in rows if a == 1000 and g == 1024)
    print(f"target 1000 apps × 1024 GPUs: {target:.3f} s ({'met' if target < 1 else 'MISSED'}: < 1 s)")
    print("\nsimulator (64 GPUs, 60 apps, testbed shape)")
    print(f"{'policy':>8} {'events':>7} {'rounds':>7} {'wall s':>7} {'events/s':>9}")
    for name, ev, rd, w in sims:
        print(f"{name:>8} {ev:>7} {rd:>7} {w:>7.2f} {ev / w:>9.0f}")


prev_g: dict[int, int] = {}

if __name__ == "__main__":
    main()
