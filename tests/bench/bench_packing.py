"""Packing quality: share of GPU capacity allocated when the first pod of a stream no longer fits.

Stream: fractional-GPU pods (0.1-1 GPU of memory and compute each) plus 10% multi-GPU pods (2-4 whole GPUs),
seeded. Tessera as kube-scheduler sees it: the extender's 0-10 priority per feasible node, the node chosen at
random among the highest (kube-scheduler's selectHost), then the GPUs the extender picks at bind. Against a
first-fit baseline (first node, lowest-index GPUs that fit).
Run: .venv/bin/python tests/bench/bench_packing.py [--seeds N]
"""

from __future__ import annotations

import argparse
import random
import time

from tessera.policy.lanes.placement import (
    Choice,
    GpuState,
    NodeSummary,
    PlacementConfig,
    Request,
    choose_gpus,
    to_priority,
    why_not,
)
from tessera.progress import Progress

GPU_MIB = 16000


def stream(rng: random.Random) -> list[Request]:
    out = []
    for _ in range(20_000):
        if rng.random() < 0.1:
            out.append(Request(rng.randint(2, 4), GPU_MIB, 100))
        else:
            frac = rng.choice([0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0])
            mem = int(GPU_MIB * min(1.0, frac * rng.uniform(0.8, 1.2)))
            out.append(Request(1, mem, max(1, min(100, round(100 * frac))), compute_fraction=rng.random()))
    return out


def first_fit(
    nodes: list[list[GpuState]], req: Request, cfg: PlacementConfig
) -> tuple[int, tuple[int, ...]] | None:
    for n, gpus in enumerate(nodes):
        fit = [g.index for g in gpus if why_not(g, req, cfg) is None]
        if len(fit) >= req.gpus:
            return n, tuple(fit[: req.gpus])
    return None


def tessera(
    nodes: list[list[GpuState]],
    req: Request,
    cfg: PlacementConfig,
    summaries: dict[int, NodeSummary],
    rng: random.Random,
) -> tuple[int, tuple[int, ...]] | None:
    choices: dict[int, Choice] = {}
    for n, gpus in enumerate(nodes):
        summary = summaries.get(n)
        if summary is None:
            summary = summaries[n] = NodeSummary.of(gpus, cfg)
        c = choose_gpus(gpus, req, cfg, summary=summary)
        if isinstance(c, Choice):
            choices[n] = c
    if not choices:
        return None
    top = max(to_priority(c.score) for c in choices.values())
    node = rng.choice([n for n, c in choices.items() if to_priority(c.score) == top])
    return node, choices[node].gpu_indices


def run(policy: str, n_nodes: int, seed: int) -> tuple[float, float, int]:
    cfg = PlacementConfig()
    nodes = [[GpuState(i, f"{n}-{i}", GPU_MIB) for i in range(8)] for n in range(n_nodes)]
    summaries: dict[int, NodeSummary] = {}
    tie_break = random.Random(seed + 1)
    placed = 0
    for req in stream(random.Random(seed)):
        if policy == "tessera":
            where = tessera(nodes, req, cfg, summaries, tie_break)
        else:
            where = first_fit(nodes, req, cfg)
        if where is None:
            break
        tenant = req.as_tenant()
        for i in where[1]:
            nodes[where[0]][i].add(tenant)
        summaries.pop(where[0], None)
        placed += 1
    gpus = [g for node in nodes for g in node]
    mem = sum(g.used_memory for g in gpus) / (GPU_MIB * len(gpus))
    comp = sum(min(100, g.used_compute) for g in gpus) / (100 * len(gpus))
    return mem, comp, placed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sizes", default="4,16,64")
    a = parser.parse_args()
    seeds = range(a.seeds)
    sizes = [int(x) for x in a.sizes.split(",")]
    rows = []
    with Progress(len(sizes) * len(seeds) * 2, "packing", enabled=True) as progress:
        for n in sizes:
            agg: dict[str, list[float]] = {"first-fit": [0, 0, 0, 0], "tessera": [0, 0, 0, 0]}
            ratios = []
            for seed in seeds:
                mems = {}
                for policy in agg:
                    t0 = time.perf_counter()
                    mem, comp, placed = run(policy, n, seed)
                    mems[policy] = mem
                    acc = agg[policy]
                    acc[0] += mem / len(seeds)
                    acc[1] += comp / len(seeds)
                    acc[2] += placed / len(seeds)
                    acc[3] += (time.perf_counter() - t0) / len(seeds)
                    progress.update(progress.done + 1, f"{n} nodes")
                ratios.append(mems["tessera"] / mems["first-fit"])
            rows.append((n, agg, ratios))
    print(
        f"\n{'nodes':>6} {'GPUs':>5} | {'first-fit mem':>13} {'compute':>8} {'pods':>6} {'s':>6} | "
        f"{'tessera mem':>11} {'compute':>8} {'pods':>6} {'s':>6} | {'mem ratio':>9} {'min-max':>13} "
        f"{'pods ratio':>10}"
    )
    for n, agg, ratios in rows:
        b, t = agg["first-fit"], agg["tessera"]
        print(
            f"{n:>6} {8 * n:>5} | {b[0]:>13.1%} {b[1]:>8.1%} {b[2]:>6.0f} {b[3]:>6.2f} | "
            f"{t[0]:>11.1%} {t[1]:>8.1%} {t[2]:>6.0f} {t[3]:>6.2f} | {t[0] / b[0]:>9.3f} "
            f"{min(ratios):>6.3f}-{max(ratios):<6.3f} {t[2] / b[2]:>10.3f}"
        )
    print(
        f"\nShare of GPU memory / compute allocated when the first pod no longer fits (mean of {len(seeds)} "
        "seeds; min-max: per-seed memory ratio); 's' = seconds per run, showing how cost grows with size."
    )


if __name__ == "__main__":
    main()
