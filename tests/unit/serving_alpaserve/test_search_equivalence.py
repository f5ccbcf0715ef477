"""The faster search returns what the unoptimised one did.

Three levels: (1) ``ShortestQueueDispatcher.replay`` gives bit-identical outcomes to one ``dispatch`` call
per request; (2) ``ComponentCache`` (per-component reuse and resuming a replay from the parent
placement's run) gives the same outcome arrays as a whole simulation along chains of replica additions,
beam-like branches and cache evictions; (3) the search's chosen plans and scores equal the ones recorded
with the search before it was made faster (``plan_cases.py``, ``recorded_plans.json``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tessera.policy.serving.alpaserve import (
    GB,
    Group,
    ModelPlacement,
    ModelProfile,
    ParallelConfig,
    StageProfile,
    Workload,
    simulate,
)
from tessera.policy.serving.alpaserve.incremental import ComponentCache
from tessera.policy.serving.alpaserve.simulator import SimStats, simulate_reference

from .plan_cases import CASES, RECORDED, SLOW_CASES, run_case

PPS = (1, 2, 3, 4, 8)  # 3 takes the generic stage loop, the others the written-out ones


def _profiles() -> dict[str, ModelProfile]:
    """Stage latencies on a 1/8 grid (exact in binary, so clocks tie often and tie-breaks are tested);
    m1 and m3 have non-blocking transfer delays between stages."""
    rng = np.random.default_rng(7)
    out = {}
    for i in range(6):
        table = {}
        for pp in PPS:
            lat = tuple(float(x) for x in rng.integers(1, 6, pp) / 8)
            comm = tuple(float(x) for x in rng.integers(0, 3, pp - 1) / 16) if i in (1, 3) else ()
            table[ParallelConfig(pp)] = StageProfile(lat, (1 * GB,) * pp, comm)
        out[f"m{i}"] = ModelProfile(f"m{i}", 0.5, 1 * GB, table)
    return out


PROFILES = _profiles()
NAMES = tuple(sorted(PROFILES))


@st.composite
def workloads(draw: st.DrawFn, max_n: int = 120) -> Workload:
    n = draw(st.integers(0, max_n))
    # arrivals on a coarse grid: many simultaneous requests and exact ties between group clocks
    arrivals = sorted(draw(st.lists(st.integers(0, 80), min_size=n, max_size=n)))
    models = draw(st.lists(st.integers(0, len(NAMES) - 1), min_size=n, max_size=n))
    slos = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0, 1e9]), min_size=n, max_size=n))
    return Workload(NAMES, np.array(arrivals, dtype=np.float64) / 4, np.array(models, dtype=np.int64),
                    np.array(slos))  # fmt: skip


@st.composite
def placements(draw: st.DrawFn) -> ModelPlacement:
    groups, d = [], 0
    for pp in draw(st.lists(st.sampled_from(PPS), min_size=1, max_size=4)):
        models = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
        groups.append(Group(tuple(range(d, d + pp)), ParallelConfig(pp), tuple(models)))
        d += pp
    return ModelPlacement(tuple(groups))


def _same(a: SimStats, b: SimStats) -> None:
    np.testing.assert_array_equal(a.finish, b.finish)  # bit-identical, inf where rejected
    np.testing.assert_array_equal(a.group, b.group)


@settings(max_examples=150, deadline=None)
@given(placements(), workloads(), st.sampled_from([0.0, 0.011, 0.125]))
def test_replay_equals_dispatch_per_request(plm: ModelPlacement, w: Workload, overhead: float) -> None:
    _same(simulate(plm, PROFILES, w, fixed_overhead_s=overhead),
          simulate_reference(plm, PROFILES, w, fixed_overhead_s=overhead))  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(PPS), min_size=1, max_size=4),
    workloads(max_n=250),
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(NAMES), st.booleans()), min_size=1, max_size=14),
    st.sampled_from([(8, 0.2), (8, 1.0), (1, 1.0), (2, 0.0)]),
    st.sampled_from([0.0, 0.011]),
)
def test_component_cache_equals_whole_simulation(
    pps: list[int],
    w: Workload,
    steps: list[tuple[int, str, bool]],
    cache_cfg: tuple[int, float],
    overhead: float,
) -> None:
    """Replica by replica (each step's parent is the previous placement, or with ``branch`` an earlier
    one, as beam search does), every score equals a whole simulation: small caches force evictions and
    full replays, resume_limit 1.0 never gives up on resuming, 0.0 gives up at once."""
    keep, limit = cache_cfg
    cache = ComponentCache(PROFILES, w, fixed_overhead_s=overhead, keep=keep, resume_limit=limit)
    base = ModelPlacement.empty([ParallelConfig(pp) for pp in pps])
    seen = [base]
    _same(cache.simulate(base), simulate_reference(base, PROFILES, w, fixed_overhead_s=overhead))
    for gi, m, branch in steps:
        parent = seen[0] if branch else seen[-1]
        gi %= len(parent.groups)
        if m in parent.groups[gi].models:
            continue
        child = parent.with_model(gi, m)
        _same(
            cache.simulate(child, (parent, gi, m)),
            simulate_reference(child, PROFILES, w, fixed_overhead_s=overhead),
        )
        seen.append(child)


def test_resuming_reevaluates_few_requests_on_bursty_traffic() -> None:
    """The point of resuming: adding one replica to a lightly loaded pool re-dispatches a small share of
    the requests (the rest are copied from the parent's run), and the outcome is still exact."""
    from .plan_cases import bench_instance

    profs, w = bench_instance(16)
    by_name = {p.name: p for p in profs}
    plm = ModelPlacement.empty([ParallelConfig(4)] * 4)
    for i, m in enumerate(sorted(by_name)):
        plm = plm.with_model(i % 4, m)
    cache = ComponentCache(by_name, w)
    cache.simulate(plm)
    child = plm.with_model(1, "m0")
    _same(cache.simulate(child, (plm, 1, "m0")), simulate_reference(child, by_name, w))
    assert cache.replayed == len(w)  # the parent only: the child was resumed, not replayed
    assert 0 < cache.reevaluated < 0.2 * len(w), (cache.reevaluated, len(w))


RECORDED_PLANS = json.loads(RECORDED.read_text())


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in CASES]
)
def test_search_returns_the_recorded_plan(case: str) -> None:
    assert run_case(case) == RECORDED_PLANS[case]
