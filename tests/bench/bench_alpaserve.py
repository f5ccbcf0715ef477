"""Benchmark: AlpaServe placement-search time for 8–64 models on 8–64 GPUs.

Run: ``.venv/bin/python tests/bench/bench_alpaserve.py [--quick]``. The baseline is Selective
Replication (the same simulator-guided fast greedy on single-GPU groups, no parallel-config
enumeration). Workload: BERT-2.7B-like synthetic profiles, 2.5 req/s per model, Gamma CV 3, SLO 5×,
30 s of arrivals for the search (the paper gives no wall-clock for the search; spec §7.9).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tessera.policy.serving.alpaserve import GB, SearchOptions, all_configs, place, synthetic_profile
from tessera.policy.serving.baselines.selective_replication import selective_replication
from tessera.progress import Progress
from tessera.sim.serving.placement_sim import gamma_workload, power_law_rates


def one(models: int, gpus: int, duration: float) -> tuple[float, float, float, float, int, int]:
    profs = [synthetic_profile(f"m{i}", 0.238, 5.4 * GB, all_configs(8, 4)) for i in range(models)]
    names = [p.name for p in profs]
    w = gamma_workload(
        power_law_rates(names, 2.5 * models, 0.0), 3.0, duration, dict.fromkeys(names, 5 * 0.238),
        np.random.default_rng(0),
    )  # fmt: skip
    t0 = time.perf_counter()
    res = place(profs, gpus, w, 13 * GB, SearchOptions())
    t1 = time.perf_counter()
    sr = selective_replication(profs, gpus, w, 13 * GB)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, res.attainment, sr.attainment, res.simulations, len(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only 8 and 16")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals for the search")
    args = ap.parse_args()
    sizes = [8, 16] if args.quick else [8, 16, 32, 64]
    cases = [(m, g) for g in sizes for m in sizes]
    rows = []
    with Progress(len(cases), "alpaserve placement bench", enabled=True) as bar:
        for i, (m, g) in enumerate(cases):
            rows.append((m, g, *one(m, g, args.duration)))
            bar.update(i + 1, f"{m} models / {g} GPUs")
    print(f"{'models':>6} {'GPUs':>5} {'reqs':>6} {'sims':>6} {'AlpaServe s':>11} {'SR s':>7} "
          f"{'ratio':>6} {'growth':>7} {'att AS':>7} {'att SR':>7}")  # fmt: skip
    prev: dict[int, float] = {}
    for m, g, ta, ts, aa, asr, sims, n in rows:
        growth = f"{ta / prev[m]:.2f}x" if m in prev else "-"
        prev[m] = ta
        print(f"{m:>6} {g:>5} {n:>6} {sims:>6} {ta:>11.2f} {ts:>7.2f} {ta / ts:>6.1f} {growth:>7} "
              f"{aa:>7.3f} {asr:>7.3f}")  # fmt: skip
    print("growth = AlpaServe time / time at half the GPUs for the same model count")


if __name__ == "__main__":
    main()
