"""FGD's experiment on Alibaba's trace, reduced (every 8th node: 152 nodes, 770 GPUs; seeds 0-2), with every pod
a DRA claim naming no device, placed by the default kube-scheduler and DRA's allocator
(tessera.sim.packing.dra_default; issue 30, docs/dra.md "Packing through DRA").

What this pins: the default allocator's placement leaves more GPU capacity unallocated than Tessera's rule
(and than FGD) at 95 and 100 % arrived, on every seed: DRA mode's reason to keep `devicePlugin` where the
packing of hand-written pods matters. Full-trace figures come from tests/bench/bench_packing_dra.py.
"""

from __future__ import annotations

from tessera.sim.packing.dra_default import DraDefault
from tessera.sim.packing.experiment import arrivals, run
from tessera.sim.packing.scenario import fgd_policy, load, tessera_config

from tests.requires import missing

from .test_packing_trace import TRACE


def test_the_default_dra_allocator_packs_worse_than_the_rule_and_fgd() -> None:
    if not TRACE.is_dir():
        missing(f"Alibaba's trace is not at {TRACE} (../shared/traces beside the checkout)")
    data = {"kind": "packing", "trace": "alibaba-gpu-v2023", "seeds": [0, 1, 2], "node_sample": 8}
    sc = load(data, __file__)
    cap = float(sum(n.gpus for n in sc.nodes))
    models = sorted({n.model for n in sc.nodes})
    for seed in sc.seeds:
        stream = arrivals(sc.pods, cap, seed)
        dra = run(sc.nodes, stream, DraDefault(), seed)
        rule = run(sc.nodes, stream, tessera_config(sc).policy(), seed)
        fgd = run(sc.nodes, stream, fgd_policy(sc, models), seed)
        for at in (94, 99):  # 95 and 100 % arrived
            assert dra.unallocated[at] > rule.unallocated[at], (seed, at, dra.unallocated[at])
            assert dra.unallocated[at] > fgd.unallocated[at], (seed, at, dra.unallocated[at])
