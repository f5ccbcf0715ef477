"""FGD's fragmentation measure and rule on hand-worked cases (Weng et al., ATC'23, §4)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tessera.policy.lanes.fragmentation import (
    Measure,
    PackingInputError,
    PackingState,
    Shape,
    ShapeDistribution,
    ShapeMix,
    fragmentation,
    score_rows,
    workload_of,
)
from tessera.policy.lanes.packing import Fgd, Tessera, tessera_order

HALF = Shape.share(1, 500)
WHOLE = Shape.share(1, 1000)
TWO = Shape.share(2, 1000)


def state_of(*nodes: tuple[list[float], float, float], model: str = "T4") -> PackingState:
    """Nodes as (free compute per GPU, free CPU milli, free memory MiB); GPUs of 1000 MiB, capacity = free."""
    st = PackingState(width=4)
    for comp, cpu, mem in nodes:
        r = st.add_row()
        st.set_row(
            r,
            model=model,
            gpu_memory_mib=[1000.0] * len(comp),
            free_compute=comp,
            free_memory_mib=[1000.0 * c for c in comp],
            cpu_free=cpu,
            memory_free=mem,
            cpu_capacity=max(cpu, 1.0),
            memory_capacity=max(mem, 1.0),
        )
    return st


def frag(st: PackingState, wl: ShapeMix, measure: Measure | None = None) -> list[float]:
    n = st.rows
    out = fragmentation(
        st.comp[:n],
        st.gfree[:n],
        st.gcap[:n],
        st.cpu[:n],
        st.mem[:n],
        st.model[:n],
        wl,
        measure or Measure.fgd(),
    )
    return [round(float(x), 9) for x in out]


def test_node_fragmentation_by_shape_and_expectation() -> None:
    st = state_of(([0.3, 1.0], 8000, 8000))
    # a 0.5-GPU pod can use the idle GPU but not the 0.3 left: 0.3 is fragmented
    assert frag(st, ShapeMix([HALF], [1.0], ["T4"])) == [0.3]
    # a 2-GPU pod cannot run here at all: every free share (1.3) is fragmented
    assert frag(st, ShapeMix([TWO], [1.0], ["T4"])) == [1.3]
    # the expectation over a 50/50 workload (Eq. 2)
    assert frag(st, ShapeMix([HALF, TWO], [1.0, 1.0], ["T4"])) == [0.8]
    # a CPU-only pod counts all free GPU as fragment (it can use none of it)
    assert frag(st, ShapeMix([Shape.share(0, 0, 1000)], [1.0], ["T4"])) == [1.3]


def test_node_lacking_cpu_or_model_fragments_everything() -> None:
    st = state_of(([0.5, 1.0], 2000, 8000))
    hungry = Shape.share(1, 500, cpu_milli=4000)
    assert frag(st, ShapeMix([hungry], [1.0], ["T4"])) == [1.5]
    v100_only = Shape(1, 0.5, gpu_memory_frac=0.5, models=frozenset({"V100M16"}))
    assert frag(st, ShapeMix([v100_only], [1.0], ["T4", "V100M16"])) == [1.5]


def test_tight_looking_gpu_that_fragments_more_loses() -> None:
    """Best-fit would put a 0.3-GPU pod on the half-used GPU (0.5 free); against a workload of 0.5-GPU pods
    that leaves 0.2 nobody can use, while the idle GPU keeps 0.7 ≥ 0.5 usable: FGD takes the idle one."""
    st = state_of(([0.5, 1.0], 8000, 8000))
    wl = ShapeMix([HALF], [1.0], ["T4"])
    pod = Shape.share(1, 300)
    scored = score_rows(st, np.arange(1), pod, wl, Measure.fgd())
    assert scored.gpus_of(0) == (1,)
    assert scored.delta[0] == pytest.approx(0.0)
    # the tight choice would have cost 0.2 of fragmentation
    st.take(0, (0,), pod)
    assert frag(st, wl) == [0.2]


def test_tight_node_short_of_cpu_loses() -> None:
    """Node 1 is fuller (best-fit's pick) but the pod would take the CPU its last idle GPU needs."""
    st = state_of(([1.0, 1.0], 16000, 64000), ([0.5, 1.0], 12000, 64000))
    pod = Shape.share(1, 500, cpu_milli=8000)
    wl = ShapeMix([pod], [1.0], ["T4"])
    scored = score_rows(st, np.arange(2), pod, wl, Measure.fgd())
    assert scored.delta.tolist() == pytest.approx([0.0, 1.0])  # node 1: its remaining 1.0 GPU is stranded
    assert Fgd(wl).choose(st, pod, random.Random(0)) == (0, (0,))


def test_node_memory_only_in_tessera_measure() -> None:
    """FGD's measure looks at CPU only; Tessera's also at node memory: the same pod strands the idle GPU."""
    st = state_of(([1.0, 1.0], 64000, 64000), ([0.5, 1.0], 64000, 40000))
    pod = Shape.share(1, 500, cpu_milli=1000, memory_mib=24000)
    wl = ShapeMix([pod], [1.0], ["T4"])
    fgd = score_rows(st, np.arange(2), pod, wl, Measure.fgd())
    ours = score_rows(st, np.arange(2), pod, wl, Measure.tessera())
    assert fgd.delta.tolist() == pytest.approx([0.0, -0.0])  # blind to memory: a tie
    assert ours.delta.tolist() == pytest.approx([0.0, 1.0])  # the idle GPU (compute and memory) stranded
    assert int(ours.rows[tessera_order(ours)[0]]) == 0


def test_gpu_memory_dimension() -> None:
    """A GPU with compute left but its memory taken is fragmented for Tessera's measure, not for FGD's."""
    st = state_of(([1.0], 8000, 8000))
    st.take(0, (0,), Shape(1, 0.2, gpu_memory_mib=800.0))  # 0.8 compute, 200 MiB left
    wl = ShapeMix([Shape(1, 0.5, gpu_memory_mib=500.0)], [1.0], ["T4"])
    assert frag(st, wl, Measure.fgd()) == [0.0]
    assert frag(st, wl, Measure.tessera()) == [pytest.approx((0.8 + 0.2) / 2)]


def test_whole_gpu_pod_goes_where_it_strands_least() -> None:
    """Workload of 2-GPU pods: a 1-GPU pod on the node with 3 idle GPUs leaves 2 usable; on the one with 2 it
    leaves a single, useless GPU."""
    st = state_of(([1.0, 1.0, 0.0, 0.0], 8000, 8000), ([1.0, 1.0, 1.0, 0.0], 8000, 8000))
    wl = ShapeMix([TWO], [1.0], ["T4"])
    scored = score_rows(st, np.arange(2), WHOLE, wl, Measure.fgd())
    assert scored.delta.tolist() == pytest.approx([1.0, 0.0])
    assert Fgd(wl).choose(st, WHOLE, random.Random(0))[0] == 1


def test_equal_nodes_scored_once_and_gpus_mapped() -> None:
    st = state_of(([0.0, 0.5], 8000, 8000), ([0.5, 0.0], 8000, 8000))
    scored = score_rows(st, np.arange(2), HALF, ShapeMix([HALF], [1.0], ["T4"]), Measure.fgd())
    assert len(scored.reps) == 1
    assert scored.gpus_of(0) == (1,) and scored.gpus_of(1) == (0,)


def test_infeasible_rows_left_out() -> None:
    st = state_of(([0.2], 8000, 8000), ([1.0], 100, 8000), ([1.0], 8000, 8000))
    scored = score_rows(
        st, np.arange(3), Shape.share(1, 500, 1000), ShapeMix([HALF], [1.0], ["T4"]), Measure.fgd()
    )
    assert scored.rows.tolist() == [2]


def test_distribution_decays_and_seeds_from_prior() -> None:
    d = ShapeDistribution(decay=0.5, prior=[(WHOLE, 1.0)])
    assert d.weights() == {WHOLE: 1.0}
    d.observe(HALF)
    d.observe(HALF)
    w = d.weights()
    assert w[WHOLE] == pytest.approx(0.25)  # halved per observation
    assert w[HALF] == pytest.approx(1.0 + 0.5)
    wl = d.workload(["T4"])
    assert wl.weight.sum() == pytest.approx(1.0)
    assert d.workload(["T4"]) is wl  # cached until the next observation


def test_distribution_keeps_heaviest_shapes() -> None:
    d = ShapeDistribution(decay=1.0, max_shapes=2)
    for milli, n in ((100, 5), (200, 3), (300, 1)):
        for _ in range(n):
            d.observe(Shape.share(1, milli))
    assert [s.compute for s in d.workload([]).shapes] == [0.1, 0.2]


def test_tessera_learns_the_workload_it_sees() -> None:
    """With no prior the rule has nothing to protect; after 2-GPU pods it keeps idle GPUs in pairs."""
    st = state_of(([1.0, 1.0, 0.0, 0.0], 8000, 8000), ([1.0, 1.0, 1.0, 0.0], 8000, 8000))
    policy = Tessera(ShapeDistribution(decay=1.0, prior=[(TWO, 5.0)]))
    assert policy.choose(st, WHOLE, random.Random(0))[0] == 1


def test_bad_inputs() -> None:
    with pytest.raises(PackingInputError):
        Shape(1, 1.5)
    with pytest.raises(PackingInputError):
        Shape(-1, 0.5)
    with pytest.raises(PackingInputError):
        ShapeDistribution(decay=0.0)
    with pytest.raises(PackingInputError):
        ShapeMix([HALF], [1.0, 2.0], [])


def test_workload_of_counts() -> None:
    wl = workload_of([HALF, HALF, WHOLE], ["T4"])
    assert dict(zip(wl.shapes, wl.weight.tolist(), strict=True)) == {
        HALF: pytest.approx(2 / 3),
        WHOLE: pytest.approx(1 / 3),
    }


def test_incremental_score_equals_fragmentation_after_minus_before() -> None:
    """score_rows updates the state GPU by GPU; on random states it equals the measure recomputed from
    scratch after the chosen placement, for both measures and for 0, 1 and 2-GPU pods."""
    rng = random.Random(7)
    shapes = [Shape.share(0, 0, 2000, 4000), Shape.share(1, 300, 1000), Shape.share(1, 1000, 4000), TWO]
    wl = ShapeMix([*shapes, Shape(1, 0.4, gpu_memory_mib=600.0, memory_mib=9000)], [3, 2, 2, 1, 1], ["T4"])
    nodes = [
        (
            [rng.choice([0.0, 0.2, 0.5, 0.7, 1.0]) for _ in range(4)],
            rng.choice([3000, 8000]),
            rng.choice([8000, 20000]),
        )
        for _ in range(30)
    ]
    st = state_of(*nodes)
    for measure in (Measure.fgd(), Measure.tessera()):
        for pod in shapes:
            scored = score_rows(st, np.arange(st.rows), pod, wl, measure)
            for i, r in enumerate(scored.rows.tolist()):
                gpus = scored.gpus_of(i)
                before = frag(st, wl, measure)[r]
                st.take(r, gpus, pod)
                after = frag(st, wl, measure)[r]
                st.give_back(r, gpus, pod)
                assert scored.delta[i] == pytest.approx(after - before, abs=1e-9)
