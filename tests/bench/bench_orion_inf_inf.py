"""Orion's inference–inference setting (Orion §6.2.3, Fig. 12) on the kernel-level model.

Run: nice -n 15 .venv/bin/python tests/bench/bench_orion_inf_inf.py [--hp resnet50,mobilenetv2,resnet101,bert,transformer]
     [--requests 200] [--seeds 0] [--policies dedicated,mps,streams,reef,orion] [--out FILE]
     nice -n 15 .venv/bin/python tests/bench/bench_orion_inf_inf.py --mix-stats [--seeds 0]
     .venv/bin/python tests/bench/bench_orion_inf_inf.py --table2

Setup, as the paper's: one HP inference client and one BE inference client on one GPU, both with Poisson
arrivals at Orion Table 3's inf-inf rates (ResNet50 50, MobileNetV2 65, ResNet101 25, BERT 5, Transformer
12 req/s [O:L264-L272]), every HP model collocated with each of the other four as BE; Fig. 12 plots each HP
model's p99 averaged over its four collocations, relative to the HP alone on the GPU. The paper: Streams/MPS
1.89× ideal on average, REEF 1.25× (Poisson), Orion within 15 % ([O:L359-L361]). Kernel mixes are the
synthetic Table 1 mixes of ``tessera.sim.orion.kernels``, not traces.

``--mix-stats`` prints, per model, the inference mix a BE client of that model runs at each seed (the BE mix of
a run with seed s is drawn with seed s + 1): its kernel count, median and longest kernel, the share of its time
in kernels needing at least 70 of the 80 SMs, its request latency, and the share of the time a BE client
keeps the GPU busy at its Table 3 rate (rate × latency). ``--table2`` prints Orion Table 2's toy collocations
on the model (Conv2d and BN2d, both launched at once under MPS): each pair's makespan and its speed-up over
running the two kernels one after the other (paper, V100: Conv2d‖BN2d 1.41, BN2d‖BN2d 1.08, Conv2d‖Conv2d 0.98).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tessera.sim.orion.experiment import INF_INF_RPS, Collocation, run_experiment
from tessera.sim.orion.gpu import ClientSpec, GpuSim
from tessera.sim.orion.kernels import BN2D, CONV2D, Kernel, mix
from tessera.sim.orion.schedulers import FreeForAll

MODELS = ("resnet50", "mobilenetv2", "resnet101", "bert", "transformer")


def table2() -> None:
    def pair(a: Kernel, b: Kernel) -> float:
        sim = GpuSim(
            [ClientSpec("a", False, (a,), arrivals=(0.0,)), ClientSpec("b", False, (b,), arrivals=(0.0,))],
            FreeForAll(),
        )
        sim.run(0.1)
        return max(lat for c in sim.clients for _, lat in c.latencies)

    print("| pair | alone, one after the other ms | together ms | speed-up | paper |")
    print("|---|---|---|---|---|")
    for (a, b), paper in (((CONV2D, BN2D), 1.41), ((BN2D, BN2D), 1.08), ((CONV2D, CONV2D), 0.98)):
        seq, both = a.duration + b.duration, pair(a, b)
        print(f"| {a.name}‖{b.name} | {seq * 1e3:.2f} | {both * 1e3:.2f} | {seq / both:.2f} | {paper} |")


def mix_stats(seeds: list[int]) -> None:
    print("| model | run seed | kernels | median kernel ms | longest kernel ms | time in kernels >= 70 SMs | "
          "request ms | Poisson rate | BE busy share |")  # fmt: skip
    print("|---" * 9 + "|")
    for m in MODELS:
        for seed in seeds:
            ks = mix(m, "inference", seed + 1)
            total = sum(k.duration for k in ks)
            wide = sum(k.duration for k in ks if k.sm_needed >= 70) / total
            rate = INF_INF_RPS[m]["poisson"]
            print(
                f"| {m} | {seed} | {len(ks)} | {statistics.median(k.duration for k in ks) * 1e3:.2f} | "
                f"{max(k.duration for k in ks) * 1e3:.2f} | {wide:.0%} | {total * 1e3:.1f} | {rate:g} | "
                f"{rate * total:.0%} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hp", default=",".join(MODELS))
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--policies", default="dedicated,mps,streams,reef,orion")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--mix-stats", action="store_true", help="print the BE inference mixes' statistics")
    ap.add_argument("--table2", action="store_true", help="print Orion Table 2's kernel pairs on the model")
    a = ap.parse_args()
    if a.table2:
        table2()
        return
    if a.mix_stats:
        mix_stats([int(s) for s in a.seeds.split(",")])
        return
    policies = tuple(a.policies.split(","))
    per_hp: dict[str, dict[str, list[float]]] = {}
    for hp in a.hp.split(","):
        for be in (m for m in MODELS if m != hp):
            for seed in (int(s) for s in a.seeds.split(",")):
                w = Collocation(
                    hp_model=hp, be_models=(be,), be_role="inference", rate_rps=INF_INF_RPS[hp]["poisson"],
                    requests=a.requests, warmup_requests=max(10, a.requests // 20), seed=seed,
                )  # fmt: skip
                r = run_experiment(w, policies)
                row = {
                    "hp": hp,
                    "be": be,
                    "seed": seed,
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
                    per_hp.setdefault(hp, {}).setdefault(p, []).append(x.ratio_p99)
    print("\nHP p99 / dedicated, averaged over the BE models (Fig. 12's bars):")
    print("| HP model | " + " | ".join(policies) + " |")
    print("|---" * (len(policies) + 1) + "|")
    for hp, d in per_hp.items():
        print(f"| {hp} | " + " | ".join(f"{statistics.mean(d[p]):.2f}" for p in policies) + " |")
    allp = {p: statistics.mean(x for d in per_hp.values() for x in d[p]) for p in policies}
    print("| mean | " + " | ".join(f"{allp[p]:.2f}" for p in policies) + " |")


if __name__ == "__main__":
    main()
