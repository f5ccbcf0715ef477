"""Symphony Fig. 7a: deferred vs eager goodput on the mixed model zoo (Symphony §3.4.2, Table 1, Table 3).

Run: nice -n 15 .venv/bin/python tests/bench/bench_symphony_fig7a.py [--shapes 1.0,0.5,0.1] [--ratios 1,2,3,4]
     [--policies symphony,symphony-clustergpus,eager,eager-headgreedy,clockwork] [--target-batch modelRate]
     [--measure 10] [--warmup 2] [--seeds 0,1,2] [--converge] [--out FILE] [--skip-done]
     nice -n 15 .venv/bin/python tests/bench/bench_symphony_fig7a.py --table FILE
     nice -n 15 .venv/bin/python tests/bench/bench_symphony_fig7a.py --stats 5500 --shapes 1.0,0.1 --ratios 2

Setup, as the paper's mixed-model case: the 35 models of Table 3 (1080Ti profiles and SLOs, bundled in
``operator/tessera/sim/data/zoos/serving-symphony-zoo.yaml``) in one cluster of ``ratio × 35`` GPUs, equally
popular, Gamma arrivals of shape k (CV = 1/√k; k = 1 is Poisson). Goodput = the highest total rate at which
every model's p99 latency meets its own SLO, dropped requests counting as misses (Symphony §1, [S:L65]),
found by bisection to 1 %; each rate runs ``warmup + measure`` seconds per seed and counts requests arriving
after the warm-up, pooled over the seeds. ``--converge`` repeats each point with twice the measured time and
prints the relative change (the issue's < 3 % criterion).

Policies: ``symphony`` = deferred (Algorithm 1) with the early-drop GETBATCH (the authors' code's
``GetBatchByExpandedWindow``) and its target batch by ``--target-batch`` (default ``modelRate``, the authors'
``BatchSizeEstimator`` over the model's own rate); ``symphony-clustergpus`` = the same with the target over
every GPU of the cluster (``clusterGpus``, this project's former rule); ``symphony-headgreedy`` = deferred with
the head-greedy GETBATCH; ``eager`` = Algorithm 1 with line 5
dispatching at once and the same GETBATCH, target and drops (Symphony §3.4's definition);
``eager-headgreedy`` = dispatch at once with the head-greedy GETBATCH; ``clockwork`` = on every free GPU the
candidate (any model, any batch size that meets its head's deadline) with the earliest latest-executable
moment (A.11); ``shepherd`` (A.11).

Each finished point is appended as one JSON line to ``--out`` (default stdout only), so a long sweep can be
stopped and resumed with ``--skip-done``; ``--table FILE`` prints the results table of docs/results-serving.md
from such a file. ``--stats RATE`` runs each policy once per seed at a fixed total rate (no search) and prints
its mean batch size, the GPUs' busy share and the bad rate.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path

from tessera.sim.serving.cluster_sim import GoodputProbe, per_model_goodput, run_policy
from tessera.sim.serving.zoo import symphony_zoo

TARGETED = ("symphony", "eager", "timeout")  # the policies --target-batch applies to
PAPER = "1.35–2.02×"
PAIRS = (  # (heading, deferred, eager) with the same GETBATCH and target rule
    ("early drop, modelRate", "symphony", "eager"),
    ("early drop, clusterGpus", "symphony-clustergpus", "eager[clusterGpus]"),
    ("head-greedy", "symphony-headgreedy", "eager-headgreedy"),
)


def label(policy: str, target_batch: str | None) -> str:
    """The policy as the table names it: ``eager[clusterGpus]`` for a non-default target."""
    return (
        policy
        if target_batch in (None, "modelRate") or policy not in TARGETED
        else f"{policy}[{target_batch}]"
    )


def effective_target(policy: str, target_batch: str) -> str | None:
    if policy == "symphony-clustergpus":
        return "clusterGpus"
    return target_batch if policy in TARGETED else None


def point(
    policy: str,
    shape: float,
    ratio: float,
    *,
    measure: float,
    warmup: float,
    seeds: list[int],
    target_batch: str,
) -> dict[str, object]:
    models = symphony_zoo()
    gpus = round(ratio * len(models))
    probes: list[GoodputProbe] = []
    t0 = time.perf_counter()
    g = per_model_goodput(
        policy, models, gpus, measure=measure, warmup=warmup, seeds=seeds, cv=1 / math.sqrt(shape),
        get_batch="earlyDropForTarget", target_batch=target_batch, probes=probes,
    )  # fmt: skip
    fail = min((p for p in probes if not p.ok), key=lambda p: p.rate, default=None)
    return {
        "policy": policy,
        "target_batch": effective_target(policy, target_batch),
        "shape": shape,
        "ratio": ratio,
        "gpus": gpus,
        "measure": measure,
        "warmup": warmup,
        "seeds": seeds,
        "goodput": round(g, 1),
        "first_failing_model": fail.worst_model if fail else None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def table(path: Path) -> None:
    """The docs table: goodput per policy at each (shape, ratio), and Symphony's ratio to each."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    measure = min(r["measure"] for r in rows)
    good: dict[tuple[float, float], dict[str, float]] = defaultdict(dict)
    fail: dict[tuple[float, float], dict[str, str]] = defaultdict(dict)
    for r in rows:
        if r["measure"] == measure:
            k = (r["shape"], r["ratio"])
            good[k][label(r["policy"], r.get("target_batch"))] = r["goodput"]
            fail[k][label(r["policy"], r.get("target_batch"))] = r["first_failing_model"] or "—"
    cols = [c for c in ("symphony", "symphony-clustergpus", "symphony-headgreedy", "eager", "eager[clusterGpus]",
                        "eager-headgreedy", "clockwork", "shepherd") if any(c in g for g in good.values())]  # fmt: skip
    print(
        f"Goodput in req/s ({measure:g} s measured per seed); Symphony (modelRate) / each baseline in brackets."
    )
    print("| Gamma shape | GPUs per model (GPUs) | " + " | ".join(cols) + " | paper, Fig. 7a |")
    print("|---" * (len(cols) + 3) + "|")
    for (shape, ratio), g in sorted(good.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        cells = []
        for c in cols:
            if c not in g:
                cells.append("—")
            elif c == "symphony" or "symphony" not in g:
                cells.append(f"{g[c]:,.0f}")
            else:
                cells.append(f"{g[c]:,.0f} ({g['symphony'] / g[c]:.2f}×)")
        print(f"| {shape:g} | {ratio:g} ({round(ratio * 35)}) | " + " | ".join(cells) + f" | {PAPER} |")
    print("\nDeferred / eager with the same GETBATCH and target (only Algorithm 1's line 5 differs):")
    print("| Gamma shape | GPUs per model | " + " | ".join(p[0] for p in PAIRS) + " | paper, Fig. 7a |")
    print("|---" * (len(PAIRS) + 3) + "|")
    for (shape, ratio), g in sorted(good.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        cells = [f"{g[d] / g[e]:.2f}×" if d in g and e in g else "—" for _, d, e in PAIRS]
        print(f"| {shape:g} | {ratio:g} | " + " | ".join(cells) + f" | {PAPER} |")
    print("\nFirst model past its p99 (lowest failing probe):")
    print("| Gamma shape | GPUs per model | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for (shape, ratio), f in sorted(fail.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        print(f"| {shape:g} | {ratio:g} | " + " | ".join(f.get(c, "—") for c in cols) + " |")


def stats(rate: float, shapes: list[float], ratios: list[float], policies: list[str], seeds: list[int],
          measure: float, warmup: float, target_batch: str) -> None:  # fmt: skip
    models = symphony_zoo()
    print(f"At {rate:g} req/s offered, {warmup:g} s + {measure:g} s per seed {seeds} (batches and busy time of "
          "the whole run; bad rate over every request):")  # fmt: skip
    print("| Gamma shape | GPUs | policy | mean batch | busy share | bad rate |")
    print("|---|---|---|---|---|---|")
    for shape in shapes:
        for ratio in ratios:
            gpus = round(ratio * len(models))
            for p in policies:
                sizes: list[int] = []
                busy: list[float] = []
                bad: list[float] = []
                for seed in seeds:
                    st = run_policy(
                        p, models, gpus, rate, duration=warmup + measure, seed=seed, cv=1 / math.sqrt(shape),
                        get_batch="earlyDropForTarget", target_batch=target_batch, warmup=warmup,
                    )  # fmt: skip
                    sizes += st.batch_sizes
                    busy.append(st.busy_fraction)
                    bad.append(st.bad_rate)
                lab = label(p, effective_target(p, target_batch))
                print(f"| {shape:g} | {gpus} | {lab} | {statistics.mean(sizes):.2f} | "
                      f"{statistics.mean(busy):.3f} | {statistics.mean(bad):.4f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.0,0.5,0.1")
    ap.add_argument("--ratios", default="1,2,3,4")
    ap.add_argument("--policies", default="symphony,symphony-clustergpus,eager,eager-headgreedy,clockwork")
    ap.add_argument("--measure", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--target-batch", default="modelRate", choices=("modelRate", "clusterGpus"))
    ap.add_argument("--converge", action="store_true", help="also run each point at 2 × --measure")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-done", action="store_true", help="skip points already in --out")
    ap.add_argument("--table", type=Path, default=None, help="print the table from this JSON-lines file")
    ap.add_argument("--stats", type=float, default=None, help="fixed total rate: batch and busy statistics")
    a = ap.parse_args()
    if a.table is not None:
        table(a.table)
        return
    seeds = [int(s) for s in a.seeds.split(",")]
    shapes = [float(s) for s in a.shapes.split(",")]
    ratios = [float(r) for r in a.ratios.split(",")]
    policies = a.policies.split(",")
    if a.stats is not None:
        stats(a.stats, shapes, ratios, policies, seeds, a.measure, a.warmup, a.target_batch)
        return
    done: set[tuple[str, str | None, float, float, float]] = set()
    if a.skip_done and a.out is not None and a.out.exists():
        for line in a.out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["policy"], r.get("target_batch"), r["shape"], r["ratio"], r["measure"]))
    measures = [a.measure, 2 * a.measure] if a.converge else [a.measure]
    for shape in shapes:
        for ratio in ratios:
            row: dict[str, float] = {}
            for policy in policies:
                for measure in measures:
                    if (policy, effective_target(policy, a.target_batch), shape, ratio, measure) in done:
                        continue
                    r = point(
                        policy, shape, ratio, measure=measure, warmup=a.warmup, seeds=seeds,
                        target_batch=a.target_batch,
                    )  # fmt: skip
                    print(json.dumps(r), flush=True)
                    if a.out is not None:
                        with a.out.open("a") as f:
                            f.write(json.dumps(r) + "\n")
                    row[f"{label(policy, r['target_batch'])}@{measure:g}"] = float(r["goodput"])  # type: ignore[arg-type]
            print(f"# shape {shape} ratio {ratio}: {row}", flush=True)


if __name__ == "__main__":
    main()
