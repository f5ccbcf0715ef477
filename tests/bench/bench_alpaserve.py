"""Benchmark: AlpaServe placement-search time for 8/16/32/64 models on as many GPUs.

    .venv/bin/python tests/bench/bench_alpaserve.py [--quick] [--grid] [--repeat N]

Prints, per size, the search's wall and CPU time (best of ``--repeat``), how it grows from one size to
the next, the simulations it scored, and the attainment and time of the baseline, Selective Replication
(the same simulator-guided fast greedy on single-GPU groups). ``--grid`` times every models × GPUs pair.
Workload: BERT-2.7B-like synthetic profiles, 2.5 req/s per model, Gamma CV 3, SLO 5×, 30 s of arrivals
for the search (the paper gives no wall-clock for the search). Target: 64 × 64 under 5 s.
The script uses only the public API, so it also times older versions of the package.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tessera.policy.serving.alpaserve import GB, SearchOptions, all_configs, place, synthetic_profile
from tessera.policy.serving.baselines.selective_replication import selective_replication
from tessera.progress import Progress
from tessera.sim.serving.placement_sim import gamma_workload, power_law_rates


def one(models: int, gpus: int, duration: float, repeat: int) -> dict[str, float]:
    profs = [synthetic_profile(f"m{i}", 0.238, 5.4 * GB, all_configs(8, 4)) for i in range(models)]
    names = [p.name for p in profs]
    w = gamma_workload(
        power_law_rates(names, 2.5 * models, 0.0), 3.0, duration, dict.fromkeys(names, 5 * 0.238),
        np.random.default_rng(0),
    )  # fmt: skip
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = place(profs, gpus, w, 13 * GB, SearchOptions())
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    t1 = time.perf_counter()
    sr = selective_replication(profs, gpus, w, 13 * GB)
    t2 = time.perf_counter()
    return {
        "wall": min(wall), "cpu": min(cpu), "sr": t2 - t1, "att": res.attainment, "att_sr": sr.attainment,
        "sims": res.simulations, "reqs": len(w),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only 8 and 16")
    ap.add_argument("--grid", action="store_true", help="every models × GPUs pair, not only models = GPUs")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size; the best is reported")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals for the search")
    args = ap.parse_args()
    sizes = [8, 16] if args.quick else [8, 16, 32, 64]
    cases = [(m, g) for g in sizes for m in sizes] if args.grid else [(n, n) for n in sizes]
    rows = []
    with Progress(len(cases), "alpaserve placement bench", enabled=True) as bar:
        for i, (m, g) in enumerate(cases):
            rows.append((m, g, one(m, g, args.duration, max(args.repeat, 1))))
            bar.update(i + 1, f"{m} models / {g} GPUs")
    print(f"{'models':>6} {'GPUs':>5} {'reqs':>6} {'sims':>6} {'wall s':>7} {'cpu s':>7} {'growth':>7} "
          f"{'SR s':>6} {'att AS':>7} {'att SR':>7}")  # fmt: skip
    prev: float | None = None
    for m, g, r in rows:
        growth = f"{r['wall'] / prev:.2f}x" if prev and not args.grid else "-"
        prev = r["wall"]
        print(f"{m:>6} {g:>5} {r['reqs']:>6} {r['sims']:>6} {r['wall']:>7.2f} {r['cpu']:>7.2f} {growth:>7} "
              f"{r['sr']:>6.2f} {r['att']:>7.3f} {r['att_sr']:>7.3f}")  # fmt: skip
    if not args.grid:
        print("growth = wall time / wall time at half the models and GPUs")


if __name__ == "__main__":
    main()
