"""Orion's inference–training setting (Orion §6.2.1, Fig. 7, Poisson) on the kernel-level model.

Run: nice -n 15 .venv/bin/python tests/bench/bench_orion_inf_train.py [--hp resnet50,mobilenetv2,resnet101,bert,transformer]
     [--be resnet50,mobilenetv2,resnet101,bert,transformer] [--requests 400] [--seeds 0,1]
     [--policies dedicated,temporal,mps,streams,reef,orion] [--out FILE]

Setup, as the paper's: one HP inference client with Poisson arrivals at Orion Table 3's inf-train rate
(ResNet50 15, MobileNetV2 40, ResNet101 9, BERT 4, Transformer 8 req/s [O:L264-L272]) and one BE training
job in a closed loop, each of the five Table 3 training jobs in turn; Fig. 7's bar for an HP model is its p99
averaged over the five collocations, relative to the HP alone on the GPU ([O:L290]). Here each collocation is
also averaged over ``--seeds`` (the paper repeats each experiment three times, [O:L256]). The paper: Orion
within 14 % of ideal, 2.3-3x lower than REEF ([O:L312]; REEF 2.5x ideal with Poisson arrivals). Kernel mixes
are the synthetic Table 1 mixes of ``tessera.sim.orion.kernels``, not traces.

Prints one JSON line per (HP, BE, seed), then per HP model the p99 / ideal of each policy averaged over the BE
jobs and seeds (Fig. 7's bars), REEF / Orion, and the per-BE means for every HP model.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tessera.sim.orion.experiment import INF_TRAIN_RPS, TRAINING_JOBS, Collocation, run_experiment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hp", default=",".join(INF_TRAIN_RPS))
    ap.add_argument("--be", default=",".join(TRAINING_JOBS))
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--policies", default="dedicated,temporal,mps,streams,reef,orion")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    policies = tuple(a.policies.split(","))
    seeds = [int(s) for s in a.seeds.split(",")]
    # ratio[hp][be][policy] = p99 / dedicated per seed
    ratio: dict[str, dict[str, dict[str, list[float]]]] = {}
    for hp in a.hp.split(","):
        for be in a.be.split(","):
            for seed in seeds:
                w = Collocation(
                    hp_model=hp, be_models=(be,), rate_rps=INF_TRAIN_RPS[hp], requests=a.requests,
                    warmup_requests=max(10, a.requests // 20), seed=seed,
                )  # fmt: skip
                r = run_experiment(w, policies)
                row = {
                    "hp": hp,
                    "be": be,
                    "seed": seed,
                    "requests": a.requests,
                    "hp_p99_dedicated_ms": round(r.hp_latency_dedicated * 1e3, 3),
                    **{f"{p}_p99_ratio": round(x.ratio_p99, 3) for p, x in r.results.items()},
                    **{
                        f"{p}_be_ratio": round(x.be_ratio, 3) for p, x in r.results.items() if x.be_throughput
                    },
                }
                print(json.dumps(row), flush=True)
                if a.out is not None:
                    with a.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                for p, x in r.results.items():
                    ratio.setdefault(hp, {}).setdefault(be, {}).setdefault(p, []).append(x.ratio_p99)
    shown = [p for p in policies if p != "dedicated"]
    print(f"\nHP p99 / dedicated, mean over the BE training jobs and seeds {seeds} (Fig. 7's bars):")
    print("| HP model | " + " | ".join(shown) + " | REEF / Orion |")
    print("|---" * (len(shown) + 2) + "|")
    means: dict[str, dict[str, float]] = {}
    for hp, by_be in ratio.items():
        means[hp] = {p: statistics.mean(x for d in by_be.values() for x in d[p]) for p in shown}
        ro = f"{means[hp]['reef'] / means[hp]['orion']:.2f}" if {"reef", "orion"} <= set(shown) else "—"
        print(f"| {hp} | " + " | ".join(f"{means[hp][p]:.3f}" for p in shown) + f" | {ro} |")
    if len(means) > 1:
        allp = {p: statistics.mean(m[p] for m in means.values()) for p in shown}
        ro = f"{allp['reef'] / allp['orion']:.2f}" if {"reef", "orion"} <= set(shown) else "—"
        print("| mean | " + " | ".join(f"{allp[p]:.3f}" for p in shown) + f" | {ro} |")
    for hp, by_be in ratio.items():
        print(f"\n{hp} HP, per BE training job (mean over seeds {seeds}):")
        print("| BE job | " + " | ".join(shown) + " |")
        print("|---" * (len(shown) + 1) + "|")
        for be, d in by_be.items():
            print(f"| {be} | " + " | ".join(f"{statistics.mean(d[p]):.3f}" for p in shown) + " |")


if __name__ == "__main__":
    main()
