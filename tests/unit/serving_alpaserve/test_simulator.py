"""Spec T13.1–T13.6 (simulator and dispatch invariants) and the Clockwork++ schedule."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tessera.policy.serving.alpaserve import (
    GB,
    NO_REPLICA,
    Group,
    ModelPlacement,
    ParallelConfig,
    ShortestQueueDispatcher,
    Workload,
    simulate,
    synthetic_profile,
)
from tessera.policy.serving.baselines.clockwork_pp import clockwork_pp_schedule, simulate_schedule
from tessera.policy.serving.baselines.selective_replication import selective_replication
from tessera.sim.serving.arrivals import gamma_arrivals

from .alpaserve_cases import P1, P2, gamma_workload, two_model_profiles

CFGS = [ParallelConfig(1), ParallelConfig(2), ParallelConfig(4)]
PROFILES = {
    f"m{i}": synthetic_profile(f"m{i}", lat, 1 * GB, CFGS) for i, lat in enumerate([0.1, 0.2, 0.35, 0.5])
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelPlacement, Workload]:
    sizes = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3))
    groups, d = [], 0
    for s in sizes:
        models = draw(st.lists(st.sampled_from(sorted(PROFILES)), unique=True, max_size=4))
        groups.append(Group(tuple(range(d, d + s)), ParallelConfig(s), tuple(models)))
        d += s
    n = draw(st.integers(1, 60))
    arrivals = sorted(draw(st.lists(st.floats(0, 20), min_size=n, max_size=n)))
    models = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    slos = draw(st.lists(st.floats(0.05, 5.0), min_size=n, max_size=n))
    names = tuple(sorted(PROFILES))
    return ModelPlacement(tuple(groups)), Workload(
        names, np.array(arrivals), np.array(models, dtype=np.int64), np.array(slos)
    )


@settings(max_examples=60, deadline=None)
@given(cases())
def test_simulator_invariants(case: tuple[ModelPlacement, Workload]) -> None:
    plm, w = case
    d = ShortestQueueDispatcher(plm, PROFILES)
    finish, group = [], []
    for t, mi, slo in zip(w.arrivals, w.models, w.slos, strict=True):
        before = [list(c) for c in d.clocks]
        gi, f = d.dispatch(float(t), w.model_names[mi], float(slo))
        finish.append(f)
        group.append(gi)
        if gi == NO_REPLICA:
            assert all(w.model_names[mi] not in g.models for g in plm.groups)  # T13.2
        else:
            assert w.model_names[mi] in plm.groups[gi].models  # routed only to a holder
        if math.isinf(f):
            assert d.clocks == before  # T13.3: drops leave every clock unchanged
        else:
            assert f - t <= slo + 1e-12  # admitted requests meet their deadline
            for a, b in zip(before, d.clocks, strict=True):
                assert all(x <= y for x, y in zip(a, b, strict=True))  # T13.4: clocks never decrease
    stats = simulate(plm, PROFILES, w)
    assert np.array_equal(stats.finish, np.array(finish)) and list(stats.group) == group
    assert 0 <= stats.attainment <= 1  # T13.1
    assert stats.per_model_requests().sum() == len(w)
    assert stats.per_group_good().sum() == stats.good.sum()
    # T13.6: with no deadline a placement that holds every model serves everything
    full = ModelPlacement((Group((0, 1), ParallelConfig(2), tuple(sorted(PROFILES))),))
    inf = Workload(w.model_names, w.arrivals, w.models, np.full(len(w), np.inf))
    assert simulate(full, PROFILES, inf).attainment == 1.0


def test_fcfs_no_overtaking_in_pipeline() -> None:
    """Invariant: for one group, admitted requests leave every stage in arrival order."""
    prof = two_model_profiles()
    w = gamma_workload({"m1": 2.0, "m2": 2.0}, 3.0, 200.0, {"m1": 3.0, "m2": 3.0}, seed=4)
    plm = ModelPlacement((Group((0, 1), P2, ("m1", "m2")),))
    stats = simulate(plm, prof, w)
    f = stats.finish[stats.good]
    assert np.all(np.diff(f) >= -1e-12)


def test_clockwork_pp_switches_per_window_and_beats_static_sr_on_shifting_load() -> None:
    """Clockwork++ (AlpaServe §6.2): re-placing per window helps when the hot model changes between windows."""
    prof = {
        m: synthetic_profile(m, 0.2, 6 * GB, [P1]) for m in ("a", "b", "c", "d")
    }  # two fit per 13 GB device
    rng = np.random.default_rng(0)
    streams = {
        "a": gamma_arrivals(9.0, 1.0, 100.0, rng),
        "b": gamma_arrivals(9.0, 1.0, 100.0, rng, start=100.0),
        "c": gamma_arrivals(0.5, 1.0, 200.0, rng),
        "d": gamma_arrivals(0.5, 1.0, 200.0, rng),
    }
    w = Workload.from_streams(streams, dict.fromkeys(prof, 1.0))
    profs = list(prof.values())
    sched = clockwork_pp_schedule(profs, 2, w, 13 * GB, window_s=100.0)
    assert len(sched.placements) == 2 and sched.placements[0] != sched.placements[1]
    cw = simulate_schedule(sched, profs, w)
    sr = selective_replication(profs, 2, w, 13 * GB)
    assert cw.attainment > sr.attainment
    assert cw.per_model_requests().sum() == len(w)
