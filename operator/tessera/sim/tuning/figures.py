"""The plots of docs/results-fluid.md, with the paper's ranges drawn beside our figures.

Run: .venv/bin/python -m tessera.sim.tuning.figures docs/img     (about 60 s; seeds 0-199 as the tests)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig
from tessera.progress import Progress
from tessera.sim.plotting import PlotsUnavailable, pyplot, save_figure
from tessera.sim.tuning.engine import TuningSim
from tessera.sim.tuning.experiments import (
    ALGORITHMS,
    Speedup,
    make_algorithm,
    packing_overhead_grid,
    paired_speedup,
    runs,
)
from tessera.sim.tuning.workload import TuningWorkload

SEEDS = range(200)  # as tests/integration/test_repro_fluid.py: one seed's ratio is noisy
FLUID = FluidConfig(max_pack=2, max_workers=4)
WORKERS = (4, 8, 16)
CURVE_TIMES = tuple(range(0, 601, 20))
# Fluid, dissertation §3.6.2: gain ranges the dissertation reports per algorithm class.
PAPER_RANGE = {
    "hyperband": (1.3, 2.0),
    "syncbohb": (1.3, 2.0),
    "asha": (1.1, 1.3),
    "bohb": (1.1, 1.3),
    "pbt": (1.0, 1.1),  # "limited" — no number given; drawn as at most 10 %
}


def macro_speedups(bar: Progress, seeds: range = SEEDS) -> dict[str, dict[str, Speedup]]:
    out: dict[str, dict[str, Speedup]] = {}
    for i, name in enumerate(ALGORITHMS):
        base, fluid = runs(name, "fifo", seeds, fluid=FLUID), runs(name, "fluid", seeds, fluid=FLUID)
        out[name] = {m: paired_speedup(base, fluid, m) for m in ("time_to_target", "makespan")}
        bar.update(i + 1, name)
    return out


def asha_curves(seeds: range = SEEDS) -> dict[tuple[int, str], list[float]]:
    """Fig. 3.10's form: the best score seen so far at each of CURVE_TIMES, mean over the seeds."""
    out: dict[tuple[int, str], list[float]] = {}
    for n in WORKERS:
        for ex in ("fifo", "fluid"):
            sums = [0.0] * len(CURVE_TIMES)
            for seed in seeds:
                w = replace(TuningWorkload(), seed=seed)
                cl = Cluster.homogeneous(1, n)
                sim = TuningSim(cl, cl.gpu_ids, w, make_algorithm("asha", w, seed), ex, FLUID)
                for k, t in enumerate(CURVE_TIMES):
                    sim.advance(t)
                    sums[k] += max(0.0, sim.result().best_score)
            out[(n, ex)] = [v / len(seeds) for v in sums]
    return out


@dataclass(frozen=True)
class _Results:
    """Every figure's numbers."""

    seeds: int
    macro: dict[str, dict[str, Speedup]]
    scaling: dict[tuple[int, str], Speedup]
    curves: dict[tuple[int, str], list[float]]
    overhead: dict[float, tuple[float, float, int]]


ALPHAS = (1.0, 1.5, 2.0, 10.0)


def compute(seeds: range) -> _Results:
    with Progress(len(ALGORITHMS) + 2, "fluid figures") as bar:
        macro = macro_speedups(bar, seeds)
        fifo8 = runs("asha", "fifo", seeds, 8, fluid=FLUID)
        scaling = {
            (n, ex): paired_speedup(fifo8, runs("asha", ex, seeds, n, fluid=FLUID), "time_to_target")
            for n in WORKERS
            for ex in ("fifo", "fluid")
        }
        curves = asha_curves(seeds)
        bar.update(len(ALGORITHMS) + 1, "asha scaling")
        overhead = {a: packing_overhead_grid(a) for a in ALPHAS}
        bar.update(len(ALGORITHMS) + 2, "overhead")
    return _Results(len(seeds), macro, scaling, curves, overhead)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", type=Path, help="where to write fluid-*.png")
    p.add_argument(
        "--seeds", type=int, default=len(SEEDS), help=f"seeds per point (default {len(SEEDS)}, as the docs)"
    )
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    try:
        plt = pyplot()
    except PlotsUnavailable as e:
        p.exit(2, f"error: {e}\n")
    out: Path = args.directory
    out.mkdir(parents=True, exist_ok=True)
    r = compute(range(args.seeds))
    _plot_macro(plt, out, r)
    _plot_scaling(plt, out, r)
    _plot_overhead(plt, out, r)
    for name in ("fluid-macro.png", "fluid-asha-scaling.png", "fluid-overhead.png"):
        print(out / name)
    _print_results(r)
    return 0


def _plot_macro(plt: Any, out: Path, r: _Results) -> None:
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(ALGORITHMS))
    for k, (metric, label) in enumerate((("time_to_target", "time to target"), ("makespan", "makespan"))):
        vals = [r.macro[a][metric] for a in ALGORITHMS]
        ax.bar(
            [x + (k - 0.5) * 0.35 for x in xs],
            [v.ratio for v in vals],
            0.35,
            yerr=[[v.ratio - v.low for v in vals], [v.high - v.ratio for v in vals]],
            capsize=3,
            label=label,
        )
    for x, a in zip(xs, ALGORITHMS, strict=True):
        lo, hi = PAPER_RANGE[a]
        ax.add_patch(Rectangle((x - 0.45, lo), 0.9, hi - lo, color="grey", alpha=0.25, lw=0))
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(list(xs), list(ALGORITHMS))
    ax.set_ylabel("speed-up of Fluid over FIFO")
    ax.set_title(
        f"8 GPUs, {r.seeds} paired seeds (95 % CI); grey = the paper's range (Fig. 3.7)", fontsize=10
    )
    ax.legend()
    save_figure(plt, fig, out / "fluid-macro.png", dpi=110)


def _plot_scaling(plt: Any, out: Path, r: _Results) -> None:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ex, style in (("fifo", "--"), ("fluid", "-")):
        ax.plot(WORKERS, [r.scaling[(n, ex)].ratio for n in WORKERS], marker="o", ls=style, label=ex)
        for n in WORKERS:
            ax2.plot(CURVE_TIMES, r.curves[(n, ex)], ls=style, label=f"{ex} {n} GPUs")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(list(WORKERS))
    ax.set_xlabel("GPU workers")
    ax.set_ylabel("time-to-target speed-up vs FIFO on 8")
    ax.set_title("ASHA (paper Fig. 3.10: FIFO best at 8; Fluid 4 ≈ FIFO 8)", fontsize=10)
    ax.legend()
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel(f"best score so far (mean of {r.seeds} seeds)")
    ax2.set_ylim(0.7, 0.9)
    ax2.set_title("ASHA max score over time (the form of Fig. 3.10)", fontsize=10)
    ax2.legend(fontsize=8)
    save_figure(plt, fig, out / "fluid-asha-scaling.png", dpi=110)


def _plot_overhead(plt: Any, out: Path, r: _Results) -> None:
    overhead = r.overhead
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{a:g}×\nc={overhead[a][2]}" for a in ALPHAS]
    ax.bar(labels, [overhead[a][0] / overhead[a][1] for a in ALPHAS], 0.5, label="ours")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.plot([len(ALPHAS) - 1], [1.0], marker="*", ms=14, color="red", ls="", label="paper at 10×: ≈ 1.0")
    ax.set_xlabel("artificial packing overhead α (c from Eq. 3.1)")
    ax.set_ylabel("speed-up of Fluid over FIFO")
    ax.set_title("Grid search, 27 configs on 8 GPUs (paper Fig. 3.13a)")
    ax.legend()
    save_figure(plt, fig, out / "fluid-overhead.png", dpi=110)


def _print_results(r: _Results) -> None:
    for a in ALGORITHMS:
        print(
            f"{a:<10} time-to-target {r.macro[a]['time_to_target']}\n{'':<10} makespan       {r.macro[a]['makespan']}"
        )
    for (n, ex), v in r.scaling.items():
        print(f"asha {ex} on {n} GPUs, time-to-target vs FIFO on 8: {v}")
    for (n, ex), c in r.curves.items():
        print(
            f"asha {ex} on {n} GPUs, best score at 100/200/300/600 s:",
            [round(c[k], 4) for k in (5, 10, 15, 30)],
        )
    print(
        "overhead (alpha: base, fluid, c):",
        {a: (round(b), round(f), c) for a, (b, f, c) in r.overhead.items()},
    )


if __name__ == "__main__":
    sys.exit(main())
