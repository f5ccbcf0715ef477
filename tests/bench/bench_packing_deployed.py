"""Packing as the chart deploys Tessera (docs/results-packing.md, "As deployed"): FGD's experiment on Alibaba's
trace with every pod placed as kube-scheduler would place it, with the chart rendered by the real Helm engine
(its scheduler configuration, and with gpuNodes.reserve its GPU-node taint and namespace routing), beside
the idealised policies, at 95 and 100 % arrived. The trace's pods live in one namespace labelled as the
chart's docs say (tessera.io/gpu-nodes: "true").

Run: .venv/bin/python tests/bench/bench_packing_deployed.py [--seeds 0,1,2] [--node-sample 1]
       [--arrivals sample|shuffle] [--rows before,before-default-scores,cpu-first-fit,chart-defaults,
       chart-reserve,tessera,fgd,first-fit]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.api import contract  # noqa: E402
from tessera.policy.lanes.packing import FirstFit, PackingPolicy  # noqa: E402
from tessera.sim.packing.deployed import (  # noqa: E402
    DEFAULT_SCHEDULER,
    DEFAULT_SCORE_WEIGHTS,
    VARYING,
    AsDeployed,
    ChartDeployment,
    Profile,
    from_chart,
)
from tessera.sim.packing.experiment import arrivals, run  # noqa: E402
from tessera.sim.packing.scenario import fgd_policy, load, tessera_config  # noqa: E402

from tests.unit.chart.chart_render import objects, render  # noqa: E402

ROWS = {
    "before": "as shipped before: CPU-only pods by default-scheduler; GPU pods by the extender, adaptive share "
    "of nodes",
    "before-default-scores": "as above, and kube-scheduler's default scores on in tessera-scheduler",
    "cpu-first-fit": "CPU-only pods first-fit; GPU pods by the extender",
    "chart-defaults": "the chart's defaults: CPU-only pods left to default-scheduler",
    "chart-reserve": "gpuNodes.reserve: true: GPU nodes tainted, the namespace's pods through tessera-scheduler",
    "tessera": "idealised: Tessera's rule placing every pod",
    "fgd": "idealised: FGD (its artifact's scoring) placing every pod",
    "first-fit": "idealised: first-fit for every pod",
}


CHART_VALUES: dict[str, dict[str, Any] | None] = {
    "chart-defaults": None,
    "chart-reserve": {"gpuNodes": {"reserve": True}},
}
NAMESPACE, NAMESPACE_LABELS = "ml", {contract.LABEL_GPU_NODES_NAMESPACE: "true"}


def chart(values: dict[str, Any] | None = None) -> ChartDeployment:
    """What the chart rendered with `values` configures for the trace's namespace."""
    return from_chart(objects(render(values)), NAMESPACE, NAMESPACE_LABELS)


def policies(row: str, sc: Any, models: list[str], now: Profile) -> PackingPolicy:
    cfg = tessera_config(sc)
    if row in CHART_VALUES:
        return chart(CHART_VALUES[row]).policy(cfg.policy())
    # before this change: the extender named managed resources (CPU-only pods never reached it) and the
    # chart left percentageOfNodesToScore at kube-scheduler's adaptive default
    before = dataclasses.replace(now, percentage=0, extender_all_pods=False)
    if row == "before":
        return AsDeployed(before, DEFAULT_SCHEDULER, cfg.policy())
    if row == "before-default-scores":
        weights = {k: DEFAULT_SCORE_WEIGHTS[k] for k in VARYING}
        return AsDeployed(dataclasses.replace(before, weights=weights), DEFAULT_SCHEDULER, cfg.policy())
    if row == "cpu-first-fit":
        return AsDeployed(now, now, cfg.policy(), cpu_first_fit=True)
    if row == "tessera":
        return cfg.policy()
    if row == "fgd":
        return fgd_policy(sc, models)
    if row == "first-fit":
        return FirstFit()
    raise SystemExit(f"unknown row {row!r}; expected one of {', '.join(ROWS)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--node-sample", type=int, default=1)
    ap.add_argument("--arrivals", default="sample", choices=("sample", "shuffle"))
    ap.add_argument("--rows", default=",".join(ROWS))
    a = ap.parse_args()
    data = yaml.safe_load((ROOT / "operator/tessera/sim/data/packing-default.yaml").read_text())
    data.update(seeds=[int(s) for s in a.seeds.split(",")], node_sample=a.node_sample, arrivals=a.arrivals)
    sc = load(data, str(ROOT / "operator/tessera/sim/data/packing-default.yaml"))
    now = chart().gpu_profile
    print(f"chart's {now.scheduler}: {now}")
    for row, values in CHART_VALUES.items():
        print(f"{row}: {chart(values)}")
    cap = float(sum(n.gpus for n in sc.nodes))
    models = sorted({n.model for n in sc.nodes})
    print(f"{len(sc.nodes)} nodes, {int(cap)} GPUs, arrivals {a.arrivals}, seeds {sc.seeds}")
    print(f"{'row':<24}{'95 %':>16}{'100 %':>16}   per seed at 100 %")
    for row in a.rows.split(","):
        t0 = time.perf_counter()
        at95, at100, failed = [], [], []
        for seed in sc.seeds:
            c = run(sc.nodes, arrivals(sc.pods, cap, seed, a.arrivals), policies(row, sc, models, now), seed)
            at95.append((100 * c.unallocated[94], c.failed[94]))
            at100.append((100 * c.unallocated[99], c.failed[99]))
            failed.append(c.failed[99])
        cells = "".join(
            f"{np.mean([u for u, _ in v]):>9.3f} / {np.mean([f for _, f in v]):>4.0f}" for v in (at95, at100)
        )
        per = " / ".join(f"{u:.3f}" for u, _ in at100)
        print(f"{row:<24}{cells}   {per}  ({time.perf_counter() - t0:.0f} s)  {ROWS[row]}", flush=True)


if __name__ == "__main__":
    main()
