"""FGD's experiment on Alibaba's trace, reduced (every 8th node: 152 nodes, 770 GPUs; seeds 0-2), with every pod
a DRA claim naming no device, placed by the default kube-scheduler and DRA's allocator
(tessera.sim.packing.dra_default; issue 30, docs/dra.md "Packing through DRA").

What this pins: the default allocator's placement leaves more GPU capacity unallocated than Tessera's rule
(and than FGD) at 95 and 100 % arrived, on every seed; through tessera-scheduler as the chart configures it
for `lanes.api: dra` (read from the chart rendered by the real Helm engine: the extender scores nodes by the
claim, the allocator takes the first device that fits) the same claims leave less than the default allocator
on every seed, and on average within a quarter point of the rule itself. Full-trace figures come from
tests/bench/bench_packing_dra.py.
"""

from __future__ import annotations

from tessera.api import contract
from tessera.sim.packing.deployed import from_chart
from tessera.sim.packing.dra_default import DraDefault
from tessera.sim.packing.experiment import arrivals, run
from tessera.sim.packing.scenario import fgd_policy, load, tessera_config

from tests.requires import missing
from tests.unit.chart.chart_render import objects, render

from .test_packing_trace import TRACE


def test_the_default_dra_allocator_packs_worse_than_the_rule_and_fgd_and_the_extender_closes_the_gap() -> (
    None
):
    if not TRACE.is_dir():
        missing(f"Alibaba's trace is not at {TRACE} (../shared/traces beside the checkout)")
    data = {"kind": "packing", "trace": "alibaba-gpu-v2023", "seeds": [0, 1, 2], "node_sample": 8}
    sc = load(data, __file__)
    cap = float(sum(n.gpus for n in sc.nodes))
    models = sorted({n.model for n in sc.nodes})
    values = {"lanes": {"api": "dra"}, "gpuNodes": {"reserve": True}}
    chart = from_chart(objects(render(values)), "ml", {contract.LABEL_GPU_NODES_NAMESPACE: "true"})
    assert chart.routed and chart.gpu_nodes_reserved
    gap = []
    for seed in sc.seeds:
        stream = arrivals(sc.pods, cap, seed)
        dra = run(sc.nodes, stream, DraDefault(), seed)
        rule = run(sc.nodes, stream, tessera_config(sc).policy(), seed)
        fgd = run(sc.nodes, stream, fgd_policy(sc, models), seed)
        for at in (94, 99):  # 95 and 100 % arrived
            assert dra.unallocated[at] > rule.unallocated[at], (seed, at, dra.unallocated[at])
            assert dra.unallocated[at] > fgd.unallocated[at], (seed, at, dra.unallocated[at])
        ext = run(sc.nodes, stream, chart.policy(tessera_config(sc).policy(), dra=True), seed)
        for at in (94, 99):
            assert ext.unallocated[at] < dra.unallocated[at], (seed, at, ext.unallocated[at])
            gap.append(ext.unallocated[at] - rule.unallocated[at])
    assert abs(sum(gap) / len(gap)) < 0.0025, gap
