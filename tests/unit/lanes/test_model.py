"""Algorithm 2.1 against the a worked admission sequence (C = 16 GB; Salus §2.3.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tessera.policy.lanes.model import Admission, GpuLanes, LaneConfig, LaneJob, LaneModelError

A = LaneJob("A", 0.5, 6)
B = LaneJob("B", 0.8, 5)
C = LaneJob("C", 0.6, 4)
D = LaneJob("D", 0.5, 8)
E = LaneJob("E", 1.0, 1)


def _abcd(config: LaneConfig | None = None) -> GpuLanes:
    g = GpuLanes(16.0, config)
    assert g.admit(A) == Admission("lane-1", "new")
    assert g.admit(B) == Admission("lane-2", "new")
    assert g.admit(C) == Admission("lane-2", "join")  # best match with L ≥ 4 is L2 (5)
    assert g.admit(D) == Admission("lane-1", "grow")  # L2 would need 16.4; L1 grows to 8 (15.4)
    assert g.lanes["lane-1"].size == 8 and g.lanes["lane-2"].size == 5
    assert g.sum_persistent() == pytest.approx(2.4)
    assert g.is_safe()
    return g


def test_worked_sequence_and_erratum_1_queues_e() -> None:
    g = _abcd()
    assert g.admit(E) is None  # literal step 4 would give L2, but 3.4 + 13 = 16.4 > 16
    assert g.is_safe()


def test_literal_listing_breaks_the_safety_condition() -> None:
    g = _abcd(LaneConfig(join_checks_persistent=False))
    assert g.admit(E) == Admission("lane-2", "join")
    assert not g.is_safe()


def test_c_leaves_then_e_joins_l2() -> None:
    g = _abcd()
    queue = [E]
    assert g.admit(E) is None
    g.depart("C")
    assert g.lanes["lane-2"].size == 5
    assert g.sum_persistent() == pytest.approx(1.8)
    assert g.admit_queued(queue) == [(E, Admission("lane-2", "join"))]
    assert queue == [] and g.is_safe()


def test_b_leaves_lane_shrinks_and_e_gets_a_new_lane() -> None:
    g = _abcd()
    freed = g.depart("B")
    assert g.lanes["lane-2"].size == 4  # shrinks to C's E
    assert freed == pytest.approx(0.8 + 1.0)
    assert g.sum_persistent() == pytest.approx(1.6)
    where = g.admit(E)
    assert where is not None and where.step == "new" and g.lanes[where.lane_id].size == 1


def test_b_and_c_leave_and_l2_is_reclaimed() -> None:
    g = _abcd()
    g.depart("B")
    freed = g.depart("C")
    assert "lane-2" not in g.lanes
    assert freed == pytest.approx(0.6 + 4)
    assert g.slack() == pytest.approx(16 - 1.0 - 8)


def test_erratum_2_grow_never_shrinks() -> None:
    """After step 4 fails only on the P check, step 9 literal would shrink a lane ≥ E."""
    g = GpuLanes(10.0)
    g.admit(LaneJob("x", 1, 6))  # lane-1 = 6
    g.admit(LaneJob("y", 1, 2))  # lane-2 = 2 → ΣP 2 + ΣL 8 = 10
    job = LaneJob("z", 0.5, 1)  # new: 12.5 ✗; join: 10.5 ✗ (erratum 1)
    assert g.find_lane(job) is None
    literal = GpuLanes(10.0, LaneConfig(grow_never_shrinks=False))
    literal.admit(LaneJob("x", 1, 6))
    literal.admit(LaneJob("y", 1, 2))
    assert literal.admit(job) == Admission("lane-2", "grow")
    assert literal.lanes["lane-2"].size == 1  # the literal step 9 shrank a lane below y's E
    assert not literal.is_safe()


def test_first_fit_option() -> None:
    g = GpuLanes(16.0, LaneConfig(best_match="first_fit"))
    g.admit(LaneJob("a", 0, 8))
    g.admit(LaneJob("b", 0, 5))
    g.admit(LaneJob("fill", 0, 3))  # 16 used
    assert g.find_lane(LaneJob("c", 0, 4)) == Admission("lane-1", "join")
    best = GpuLanes(16.0)
    best.admit(LaneJob("a", 0, 8))
    best.admit(LaneJob("b", 0, 5))
    best.admit(LaneJob("fill", 0, 3))
    assert best.find_lane(LaneJob("c", 0, 4)) == Admission("lane-2", "join")


def test_bad_input_is_rejected_with_reason() -> None:
    with pytest.raises(LaneModelError, match="capacity"):
        GpuLanes(0)
    with pytest.raises(LaneModelError, match=">= 0"):
        LaneJob("a", -1, 1)
    g = GpuLanes(16)
    g.admit(A)
    with pytest.raises(LaneModelError, match="already"):
        g.admit(A)
    with pytest.raises(LaneModelError, match="not on this GPU"):
        g.depart("zzz")


def test_compute_shares() -> None:
    g = GpuLanes(16)
    g.admit(LaneJob("a", 0, 4, compute_percent=60))
    g.admit(LaneJob("b", 0, 6, compute_percent=80))
    g.admit(LaneJob("c", 0, 2))
    shares = g.compute_shares()
    assert shares["lane-1"] + shares["lane-2"] <= 100 and shares["lane-2"] > shares["lane-1"]
    assert shares["lane-3"] >= 1
    eq = GpuLanes(16, LaneConfig(compute_mode="equal"))
    for i in range(3):
        eq.admit(LaneJob(str(i), 0, 5))
    assert eq.compute_shares() == {"lane-1": 33, "lane-2": 33, "lane-3": 33}


_jobs = st.tuples(
    st.floats(0, 4, allow_nan=False), st.floats(0, 12, allow_nan=False), st.booleans(), st.integers(0, 30)
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_jobs, min_size=1, max_size=40), best=st.sampled_from(["best_fit", "first_fit"]))
def test_safety_holds_after_any_admissions_and_departures(
    ops: list[tuple[float, float, bool, int]], best: str
) -> None:
    """Spec §4.1.1: Eq. 2.1 after every admit and leave, with lane size = max E of its jobs."""
    g = GpuLanes(16.0, LaneConfig(best_match=best))  # type: ignore[arg-type]
    queue: list[LaneJob] = []
    for n, (p, e, leave, pick) in enumerate(ops):
        if leave and g.jobs():
            g.depart(g.jobs()[pick % len(g.jobs())])
            g.admit_queued(queue)
        else:
            job = LaneJob(f"j{n}", p, e)
            if g.admit(job) is None:
                queue.append(job)
        assert g.is_safe()
        assert g.slack() >= -1e-6
        for lane in g.lanes.values():
            assert lane.jobs and lane.size == pytest.approx(lane.max_ephemeral())
