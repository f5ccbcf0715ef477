"""Hypothesis: the StaticFluid invariants of Algorithm 3.1 and the Lemma 1–3 bound (Fluid, dissertation §3.4.2, Appendix B)."""

import itertools
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st
from tessera.cluster import Cluster
from tessera.policy.fluid import (
    FluidConfig,
    TrialDemand,
    d_binds,
    plan_trial_group,
    static_bound,
    static_widths,
)
from tessera.sim.tuning.fixed_group import run_static_group

heights = st.lists(st.floats(min_value=0.01, max_value=1000.0), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(h=heights, n=st.integers(1, 32), c=st.integers(1, 4), d=st.integers(1, 8))
def test_static_invariants(h: list[float], n: int, c: int, d: int) -> None:
    w = static_widths(h, n, FluidConfig(max_pack=c, max_workers=d))
    allowed = {Fraction(1, c)} | {Fraction(k) for k in range(1, d + 1)}
    assert all(x in allowed for x in w)
    order = sorted(range(len(h)), key=lambda i: h[i])
    assert all(w[a] <= w[b] for a, b in itertools.pairwise(order))  # non-decreasing in h
    total = sum(Fraction(x) for x in h)
    large = [Fraction(x) * n / total >= 1 for x in h]  # w*_i >= 1: the whole-GPU set (with c = 1 the
    big = sum(x for x, is_large in zip(w, large, strict=True) if is_large)  # small set also gets width 1)
    assert big <= n
    if not all(large):
        assert n - big >= 1  # a GPU stays for the packed trials
        assert all(x == Fraction(1, c) for x, is_large in zip(w, large, strict=True) if not is_large)


@settings(max_examples=100, deadline=None)
@given(h=heights, machines=st.integers(1, 4), per=st.integers(1, 8), c=st.integers(1, 4), d=st.integers(1, 8))
def test_placement_never_exceeds_c_per_gpu(h: list[float], machines: int, per: int, c: int, d: int) -> None:
    cluster = Cluster.homogeneous(machines, per)
    demands = [TrialDemand(f"t{i}", x) for i, x in enumerate(h)]
    p = plan_trial_group(cluster, cluster.gpu_ids, demands, FluidConfig(max_pack=c, max_workers=d))
    assert all(len(ls) <= c for ls in p.lanes.values())
    gang_gpus = [g for gs in p.gangs.values() for g in gs]
    assert len(gang_gpus) == len(set(gang_gpus))
    assert not set(gang_gpus) & {g for g, ls in p.lanes.items() if ls}
    placed = set(p.gangs) | {lane.trial_id for ls in p.lanes.values() for lane in ls}
    assert placed | set(p.queued) == {d.trial_id for d in demands} and not placed & set(p.queued)
    for t, gs in p.gangs.items():
        assert len(gs) == p.widths[t]


@settings(max_examples=60, deadline=None)
@given(h=st.lists(st.floats(min_value=0.1, max_value=100.0), min_size=1, max_size=25), n=st.integers(1, 12))
def test_static_makespan_within_bound(h: list[float], n: int) -> None:
    cfg = FluidConfig(max_pack=2, max_workers=64, dynamic=False)
    assert not d_binds(h, n, cfg.d)
    makespan = run_static_group(h, n, cfg)
    w = static_widths(h, n, cfg)
    assert makespan < static_bound(h, w, n) + 1e-9
