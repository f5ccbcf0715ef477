"""Packing quality: share of GPU capacity allocated when the first pod of a stream no longer fits.

Stream: fractional-GPU pods (0.1-1 GPU of memory and compute each) plus 10% multi-GPU pods (2-4 whole GPUs),
seeded. Tessera's choice (best node by the extender's combined score, then its best GPUs) against a
first-fit baseline (first node, lowest-index GPUs that fit). Run: .venv/bin/python tests/bench/bench_packing.py
"""

from __future__ import annotations

import random
import time

from tessera.policy.lanes.placement import Choice, GpuState, PlacementConfig, Request, choose_gpus, why_not
from tessera.progress import Progress

GPU_MIB = 16000
SEEDS = range(5)


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
    nodes: list[list[GpuState]], req: Request, cfg: PlacementConfig
) -> tuple[int, tuple[int, ...]] | None:
    best: tuple[float, int, tuple[int, ...]] | None = None
    for n, gpus in enumerate(nodes):
        c = choose_gpus(gpus, req, cfg)
        if isinstance(c, Choice) and (best is None or c.score > best[0]):
            best = (c.score, n, c.gpu_indices)
    return None if best is None else (best[1], best[2])


def run(policy: str, n_nodes: int, seed: int) -> tuple[float, float, int]:
    cfg = PlacementConfig()
    nodes = [[GpuState(i, f"{n}-{i}", GPU_MIB) for i in range(8)] for n in range(n_nodes)]
    place = tessera if policy == "tessera" else first_fit
    placed = 0
    for req in stream(random.Random(seed)):
        where = place(nodes, req, cfg)
        if where is None:
            break
        for i in where[1]:
            nodes[where[0]][i].tenants.append(req.as_tenant())
        placed += 1
    gpus = [g for node in nodes for g in node]
    mem = sum(g.used_memory for g in gpus) / (GPU_MIB * len(gpus))
    comp = sum(min(100, g.used_compute) for g in gpus) / (100 * len(gpus))
    return mem, comp, placed


def main() -> None:
    sizes = [4, 16, 64]
    rows = []
    with Progress(len(sizes) * len(SEEDS) * 2, "packing", enabled=True) as progress:
        for n in sizes:
            agg: dict[str, list[float]] = {"first-fit": [0, 0, 0, 0], "tessera": [0, 0, 0, 0]}
            for seed in SEEDS:
                for policy in agg:
                    t0 = time.perf_counter()
                    mem, comp, placed = run(policy, n, seed)
                    a = agg[policy]
                    a[0] += mem / len(SEEDS)
                    a[1] += comp / len(SEEDS)
                    a[2] += placed / len(SEEDS)
                    a[3] += (time.perf_counter() - t0) / len(SEEDS)
                    progress.update(progress.done + 1, f"{n} nodes")
            rows.append((n, agg))
    print(
        f"\n{'nodes':>6} {'GPUs':>5} | {'first-fit mem':>13} {'compute':>8} {'pods':>6} {'s':>6} | "
        f"{'tessera mem':>11} {'compute':>8} {'pods':>6} {'s':>6} | {'mem ratio':>9} {'pods ratio':>10}"
    )
    for n, agg in rows:
        b, t = agg["first-fit"], agg["tessera"]
        print(
            f"{n:>6} {8 * n:>5} | {b[0]:>13.1%} {b[1]:>8.1%} {b[2]:>6.0f} {b[3]:>6.2f} | "
            f"{t[0]:>11.1%} {t[1]:>8.1%} {t[2]:>6.0f} {t[3]:>6.2f} | {t[0] / b[0]:>9.3f} {t[2] / b[2]:>10.3f}"
        )
    print(
        "\nShare of GPU memory / compute allocated when the first pod no longer fits (mean of 5 seeds);"
        " 's' = seconds per run, showing how cost grows with cluster size."
    )


if __name__ == "__main__":
    main()
