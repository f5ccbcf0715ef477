"""Packing quality on Alibaba's GPU-sharing trace (FGD's experiment, Weng et al., ATC'23, §6): every policy
over seeds, the share of GPU capacity left unallocated and the failed pods at 80/90/95/100 % arrived, FGD's
published numbers beside them, and (with --through-extender) the first seed replayed through the extender's
own filter → prioritize → bind.

The same run as `tessera simulate operator/tessera/sim/data/packing-default.yaml`, with knobs for reduced runs
and the ablations of Tessera's rule (the measure's extra dimensions, the prior, the decay).

Run: .venv/bin/python tests/bench/bench_packing.py [--seeds 0,1,2] [--node-sample 1] [--policies a,b]
       [--through-extender] [--ablation] [--plots DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from tessera.policy.lanes.fragmentation import Measure
from tessera.policy.lanes.packing import POLICIES, Tessera
from tessera.sim.packing.experiment import arrivals
from tessera.sim.packing.experiment import run as run_policy
from tessera.sim.packing.scenario import REPORT_AT, load, run, tessera_config

DEFAULT = (
    Path(__file__).resolve().parents[2] / "operator" / "tessera" / "sim" / "data" / "packing-default.yaml"
)


def ablation(sc, seeds: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Tessera's rule with parts of it switched off: which extension matters on this trace."""
    fixed = dataclasses.replace(sc, prior="trace", decay=1.0)  # FGD's target: the pod list's distribution
    variants = {
        "tessera (GPU mem + node mem, online, best-fit ties)": (Measure.tessera(), sc),
        "  node memory off": (Measure(gpu_memory=True, node_memory=False), sc),
        "  both off (FGD's measure, online workload)": (Measure.fgd(), sc),
        "  FGD's measure and fixed workload (= FGD, ties)": (Measure.fgd(), fixed),
    }
    cap = float(sum(n.gpus for n in sc.nodes))
    print("\nablation: GPU capacity unallocated (%) / failed pods, mean over seeds")
    print(f"{'variant':<52}" + "".join(f"{p:>15}" for p in REPORT_AT))
    for label, (measure, scen) in variants.items():
        cells = {p: [] for p in REPORT_AT}  # type: dict[int, list[tuple[float, int]]]
        for seed in seeds:
            policy = Tessera(tessera_config(scen).distribution(), measure)
            c = run_policy(sc.nodes, arrivals(sc.pods, cap, seed), policy, seed)
            for p in REPORT_AT:
                cells[p].append((c.unallocated[p - 1], c.failed[p - 1]))
        row = "".join(
            f"{100 * sum(u for u, _ in v) / len(v):>8.2f} / {sum(f for _, f in v) / len(v):>4.0f}"
            for v in cells.values()
        )
        print(f"{label:<52}{row}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--node-sample", type=int, default=1, help="keep every k-th node (a reduced run)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--through-extender", action="store_true")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--plots", metavar="DIR")
    a = ap.parse_args()
    import yaml

    data = yaml.safe_load(DEFAULT.read_text())
    data.update(
        seeds=[int(s) for s in a.seeds.split(",")],
        node_sample=a.node_sample,
        policies=a.policies.split(","),
        through_extender=a.through_extender,
    )
    sc = load(data, str(DEFAULT))
    t0 = time.perf_counter()
    res = run(sc, progress=True)
    print(res.table())
    print(f"({time.perf_counter() - t0:.0f} s)")
    if a.plots:
        for p in res.plots(Path(a.plots)):
            print(f"wrote {p}")
    if a.ablation:
        ablation(sc, sc.seeds)


if __name__ == "__main__":
    main()
