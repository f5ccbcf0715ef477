"""Symphony Fig. 7a: deferred vs eager goodput on the mixed model zoo (Symphony §3.4.2, Table 1, Table 3).

Run: nice -n 15 .venv/bin/python tests/bench/bench_symphony_fig7a.py [--shapes 1.0,0.5,0.1] [--ratios 1,2,3,4]
     [--policies symphony,eager] [--measure 10] [--warmup 2] [--seeds 0,1,2] [--converge] [--out FILE]

Setup, as the paper's mixed-model case: the 35 models of Table 3 (1080Ti profiles and SLOs, bundled in
``operator/tessera/sim/data/zoos/serving-symphony-zoo.yaml``) in one cluster of ``ratio × 35`` GPUs, equally
popular, Gamma arrivals of shape k (CV = 1/√k; k = 1 is Poisson). Goodput = the highest total rate at which
every model's p99 latency meets its own SLO, dropped requests counting as misses (Symphony §1, [S:L65]),
found by bisection to 1 %; each rate runs ``warmup + measure`` seconds per seed and counts requests arriving
after the warm-up, pooled over the seeds. ``--converge`` repeats each point with twice the measured time and
prints the relative change (the issue's < 3 % criterion).

Policies: ``symphony`` = deferred (Algorithm 1), ``eager`` = Algorithm 1 with line 5 dispatching at once and
the same GETBATCH and drops (Symphony §3.4's definition), ``eager-headgreedy`` = eager with the head-greedy
GETBATCH (what ``eager`` was before), ``shepherd``, ``clockwork`` (A.11). ``--get-batch`` picks the GETBATCH of
symphony/eager (default the early-drop one, the operator's and the authors' code's).

Each finished point is appended as one JSON line to ``--out`` (default stdout only), so a long sweep can be
stopped and resumed with ``--skip-done``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from tessera.sim.serving.cluster_sim import GoodputProbe, per_model_goodput
from tessera.sim.serving.zoo import symphony_zoo


def point(
    policy: str,
    shape: float,
    ratio: float,
    *,
    measure: float,
    warmup: float,
    seeds: list[int],
    get_batch: str,
) -> dict[str, object]:
    models = symphony_zoo()
    gpus = round(ratio * len(models))
    probes: list[GoodputProbe] = []
    t0 = time.perf_counter()
    g = per_model_goodput(
        policy, models, gpus, measure=measure, warmup=warmup, seeds=seeds, cv=1 / math.sqrt(shape),
        get_batch=get_batch, probes=probes,
    )  # fmt: skip
    fail = min((p for p in probes if not p.ok), key=lambda p: p.rate, default=None)
    return {
        "policy": policy,
        "shape": shape,
        "ratio": ratio,
        "gpus": gpus,
        "measure": measure,
        "warmup": warmup,
        "seeds": seeds,
        "get_batch": get_batch,
        "goodput": round(g, 1),
        "first_failing_model": fail.worst_model if fail else None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.0,0.5,0.1")
    ap.add_argument("--ratios", default="1,2,3,4")
    ap.add_argument("--policies", default="symphony,eager")
    ap.add_argument("--measure", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--get-batch", default="earlyDropForTarget")
    ap.add_argument("--converge", action="store_true", help="also run each point at 2 × --measure")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-done", action="store_true", help="skip points already in --out")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    done: set[tuple[str, float, float, float]] = set()
    if a.skip_done and a.out is not None and a.out.exists():
        for line in a.out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["policy"], r["shape"], r["ratio"], r["measure"]))
    measures = [a.measure, 2 * a.measure] if a.converge else [a.measure]
    for shape in (float(s) for s in a.shapes.split(",")):
        for ratio in (float(r) for r in a.ratios.split(",")):
            row: dict[str, float] = {}
            for policy in a.policies.split(","):
                for measure in measures:
                    if (policy, shape, ratio, measure) in done:
                        continue
                    r = point(
                        policy, shape, ratio, measure=measure, warmup=a.warmup, seeds=seeds,
                        get_batch=a.get_batch,
                    )  # fmt: skip
                    print(json.dumps(r), flush=True)
                    if a.out is not None:
                        with a.out.open("a") as f:
                            f.write(json.dumps(r) + "\n")
                    row[f"{policy}@{measure:g}"] = float(r["goodput"])  # type: ignore[arg-type]
            print(f"# shape {shape} ratio {ratio}: {row}", flush=True)


if __name__ == "__main__":
    main()
