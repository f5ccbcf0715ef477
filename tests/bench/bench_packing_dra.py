"""Packing through DRA (docs/dra.md, "Packing"; issue 30): FGD's experiment on Alibaba's trace with every pod a
claim that names no device, placed by the default kube-scheduler and DRA's structured allocator (the first
device of the slice that fits), beside FGD (its artifact's scoring) and Tessera's rule (what the extender
places by), at 95 and 100 % arrived; and the same claims through tessera-scheduler as the chart configures it
with `lanes.api: dra` and `gpuNodes.reserve` (the extender reads each pod's claim and scores nodes by Tessera's
rule, kube-scheduler adds its own scores; the allocator still takes the first device of the node that fits).

Run: .venv/bin/python tests/bench/bench_packing_dra.py [--seeds 0,1,2] [--node-sample 1]
       [--arrivals sample|shuffle] [--rows dra-default,dra-most-allocated,dra-extender,fgd,tessera]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.api import contract  # noqa: E402
from tessera.policy.lanes.packing import PackingPolicy  # noqa: E402
from tessera.sim.packing.deployed import from_chart  # noqa: E402
from tessera.sim.packing.dra_default import MOST_ALLOCATED, DraDefault  # noqa: E402
from tessera.sim.packing.experiment import arrivals, run  # noqa: E402
from tessera.sim.packing.scenario import fgd_policy, load, tessera_config  # noqa: E402

from tests.unit.chart.chart_render import objects, render  # noqa: E402

ROWS = {
    "dra-default": "DRA, default kube-scheduler: LeastAllocated + BalancedAllocation, adaptive share of nodes, "
    "first device that fits",
    "dra-most-allocated": "DRA, kube-scheduler with NodeResourcesFit MostAllocated, every node scored",
    "dra-extender": "DRA, tessera-scheduler as the chart configures it (lanes.api dra, gpuNodes.reserve): the "
    "extender's node priorities from the claim, first device that fits",
    "fgd": "FGD (its artifact's scoring) placing every pod",
    "tessera": "Tessera's rule placing every pod (the extender, lanes.api devicePlugin)",
}


def policy(row: str, sc: Any, models: list[str]) -> PackingPolicy:
    if row == "dra-default":
        return DraDefault()
    if row == "dra-most-allocated":
        return DraDefault(MOST_ALLOCATED, name="dra-most-allocated")
    if row == "dra-extender":
        values = {"lanes": {"api": "dra"}, "gpuNodes": {"reserve": True}}
        labels = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}
        deployment = from_chart(objects(render(values)), "ml", labels)
        assert deployment.routed and deployment.gpu_nodes_reserved
        return deployment.policy(tessera_config(sc).policy(), dra=True)
    if row == "fgd":
        return fgd_policy(sc, models)
    if row == "tessera":
        return tessera_config(sc).policy()
    raise SystemExit(f"unknown row {row!r}; expected one of {', '.join(ROWS)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--node-sample", type=int, default=1)
    ap.add_argument("--arrivals", default="sample", choices=("sample", "shuffle"))
    ap.add_argument("--rows", default=",".join(ROWS))
    a = ap.parse_args()
    path = ROOT / "operator/tessera/sim/data/packing-default.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(seeds=[int(s) for s in a.seeds.split(",")], node_sample=a.node_sample, arrivals=a.arrivals)
    sc = load(data, str(path))
    cap = float(sum(n.gpus for n in sc.nodes))
    models = sorted({n.model for n in sc.nodes})
    print(f"{len(sc.nodes)} nodes, {int(cap)} GPUs, arrivals {a.arrivals}, seeds {sc.seeds}")
    print(f"{'row':<20}{'95 %':>16}{'100 %':>16}   per seed at 100 %")
    for row in a.rows.split(","):
        t0 = time.perf_counter()
        at95, at100 = [], []
        for seed in sc.seeds:
            c = run(sc.nodes, arrivals(sc.pods, cap, seed, a.arrivals), policy(row, sc, models), seed)
            at95.append((100 * c.unallocated[94], c.failed[94]))
            at100.append((100 * c.unallocated[99], c.failed[99]))
        cells = "".join(
            f"{np.mean([u for u, _ in v]):>9.3f} / {np.mean([f for _, f in v]):>4.0f}" for v in (at95, at100)
        )
        per = " / ".join(f"{u:.3f}" for u, _ in at100)
        print(f"{row:<20}{cells}   {per}  ({time.perf_counter() - t0:.0f} s)  {ROWS[row]}", flush=True)


if __name__ == "__main__":
    main()
