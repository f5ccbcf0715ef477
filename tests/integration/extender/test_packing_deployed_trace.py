"""FGD's experiment on Alibaba's trace, reduced (every 8th node: 152 nodes, 770 GPUs), with every pod placed
as the chart deploys Tessera (tessera.sim.packing.deployed, profiles read from the shipped configuration).

What this pins: with the chart's gpuNodes.reserve (GPU nodes tainted, the trace's namespace labelled so that
its CPU-only pods are routed through tessera-scheduler; read from the chart rendered by the real Helm
engine), the deployed system places every pod exactly where Tessera's rule does (so the idealised figures are
the deployed ones); as shipped before (CPU-only pods spread by default-scheduler, the extender asked only
about GPU pods, kube-scheduler's adaptive share of nodes) it leaves at least 1.5× FGD's share unallocated
(issue #34: 13.4 % against 4.9 % on the full trace).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import mean

import pytest
import yaml
from tessera.api import contract
from tessera.sim.packing.deployed import DEFAULT_SCHEDULER, AsDeployed, from_chart, profile_from_config
from tessera.sim.packing.experiment import arrivals, run
from tessera.sim.packing.scenario import fgd_policy, load, tessera_config
from tessera.sim.packing.through_extender import extender_shapes, nominal_nodes

from tests.requires import missing
from tests.unit.chart.chart_render import objects, render

from .test_packing_trace import TRACE

CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "scheduler" / "kube-scheduler-config.yaml"


def test_deployed_as_the_chart_configures_it_places_pods_as_the_rule() -> None:
    if not TRACE.is_dir():
        missing(f"Alibaba's trace is not at {TRACE} (../shared/traces beside the checkout)")
    data = {"kind": "packing", "trace": "alibaba-gpu-v2023", "seeds": [0, 1, 2], "node_sample": 8}
    sc = load(data, __file__)
    labels = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}
    reserve = from_chart(objects(render({"gpuNodes": {"reserve": True}})), "ml", labels)
    assert reserve.routed and reserve.gpu_nodes_reserved
    now = profile_from_config(yaml.safe_load(CONFIG.read_text()), "tessera-scheduler")
    before = dataclasses.replace(now, percentage=0, extender_all_pods=False)
    cap = float(sum(n.gpus for n in sc.nodes))
    models = sorted({n.model for n in sc.nodes})
    worse = []
    for seed in sc.seeds:
        stream = arrivals(sc.pods, cap, seed)
        ideal = run(sc.nodes, stream, tessera_config(sc).policy(), seed)
        routed = run(sc.nodes, stream, reserve.policy(tessera_config(sc).policy()), seed)
        assert routed.picks == ideal.picks
        shipped = run(
            sc.nodes, stream, AsDeployed(before, DEFAULT_SCHEDULER, tessera_config(sc).policy()), seed
        )
        fgd = run(sc.nodes, stream, fgd_policy(sc, models), seed)
        worse.append(shipped.unallocated[-1] / fgd.unallocated[-1])
    assert sum(worse) / len(worse) >= 1.5, worse


def replay_sample_shares(seeds: list[int]) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Unallocated shares at 95 and 100 % arrived, per seed, on the real-scheduler replay's sample (every 48th
    node: 26 nodes, 132 GPUs): Tessera as deployed (a fresh extender per seed) and FGD."""
    if not TRACE.is_dir():
        missing(f"Alibaba's trace is not at {TRACE} (../shared/traces beside the checkout)")
    data = {"kind": "packing", "trace": "alibaba-gpu-v2023", "seeds": seeds, "node_sample": 48}
    sc = load(data, __file__)
    nodes = nominal_nodes(sc.nodes)
    now = profile_from_config(yaml.safe_load(CONFIG.read_text()), "tessera-scheduler")
    cap = float(sum(n.gpus for n in nodes))
    ours: dict[int, list[float]] = {95: [], 100: []}
    theirs: dict[int, list[float]] = {95: [], 100: []}
    for seed in sc.seeds:
        stream = arrivals(sc.pods, cap, seed)
        sim = run(nodes, extender_shapes(stream), AsDeployed(now, now, tessera_config(sc).policy()), seed)
        fgd = run(nodes, stream, fgd_policy(sc, sorted({n.model for n in nodes})), seed)
        for p in (95, 100):
            ours[p].append(sim.unallocated[p - 1])
            theirs[p].append(fgd.unallocated[p - 1])
    return ours, theirs


@pytest.mark.xfail(
    strict=True,
    reason="measured on the real-scheduler replay's sample (every 48th node: 26 nodes, 132 GPUs; seeds 0-2), "
    "a fresh extender per seed: "
    "Tessera as deployed 7.43 / 6.85 % unallocated at 95 / 100 %, FGD 7.18 / 6.70 % (per seed at 100 %: "
    "4.86 / 8.28 / 7.41 against 6.37 / 7.08 / 6.65); three seeds of 26 nodes are within noise (the paired "
    "difference's sd over 20 seeds is 1.1 points at 100 %): over 20 seeds Tessera is ahead, the next test; "
    "on the full trace Tessera is no worse (results-packing.md)",
)
def test_no_worse_than_fgd_on_the_replay_sample() -> None:
    ours, theirs = replay_sample_shares([0, 1, 2])
    assert all(mean(ours[p]) <= mean(theirs[p]) for p in (95, 100)), (ours, theirs)


def test_no_worse_than_fgd_on_the_replay_sample_over_20_seeds() -> None:
    """The same sample and rule over seeds 0-19 (the replay itself matches this simulation pod for pod:
    k8s/test_packing_replay.py): measured 7.11 / 6.38 % against FGD's 7.48 / 6.57 % at 95 / 100 %."""
    ours, theirs = replay_sample_shares(list(range(20)))
    assert all(mean(ours[p]) <= mean(theirs[p]) for p in (95, 100)), (ours, theirs)
