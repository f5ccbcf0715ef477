"""The per-model batching baselines (Clockwork, Nexus, Clipper, Triton timeout batching) on traces small enough
to work out by hand. Latency model l_B(k) = k · max solo (s0 = 0, s1 = 1); planners use mean solo 1.0
unless stated, so estimate(k) = k."""

from __future__ import annotations

import pytest
from tessera.policy.serving.baselines.batching import (
    ClipperScheduler,
    ClockworkScheduler,
    NexusScheduler,
    TimeoutScheduler,
)
from tessera.policy.serving.common import BatchLatencyModel, BatchTimings, DropReason, Request

LAT = BatchLatencyModel(s0=0.0, s1=1.0)


def _r(rid: int, arrival: float, deadline: float) -> Request:
    return Request(rid, "m", arrival, deadline)


def test_timeout_dispatches_on_full_batch_or_after_max_queue_delay() -> None:
    s = TimeoutScheduler(LAT, 1.0, max_batch=2, max_queue_delay=0.5)
    s.enqueue(_r(0, 0.0, 10.0), 0.0)
    assert s.next_batch(0.0, 0) is None and s.next_wakeup(0.0) == 0.5  # waits for a partner
    s.enqueue(_r(1, 0.2, 10.0), 0.2)
    b = s.next_batch(0.2, 0)  # full: goes at once
    assert b is not None and [r.rid for r in b.requests] == [0, 1]
    s.enqueue(_r(2, 1.0, 10.0), 1.0)
    assert s.next_batch(1.2, 0) is None
    b = s.next_batch(1.5, 0)  # oldest waited max_queue_delay: goes alone
    assert b is not None and [r.rid for r in b.requests] == [2]
    s.enqueue(_r(3, 2.0, 2.4), 2.0)
    assert s.next_batch(3.0, 0) is None  # expired while queued: dropped, not run
    assert [(d.request.rid, d.reason) for d in s.take_drops()] == [(3, DropReason.EXPIRED)]


def test_clipper_sizes_batch_from_throughput_times_earliest_slack() -> None:
    s = ClipperScheduler(LAT, 1.0, max_batch=16)  # initial throughput 1/estimate(1) = 1 per unit
    for rid, dl in ((0, 5.0), (1, 2.5), (2, 6.0), (3, 0.0 + 1e-9)):
        s.enqueue(_r(rid, 0.0, max(dl, 1e-9)), 0.0)
    b = s.next_batch(0.5, 0)  # r3 expired; earliest deadline 2.5 → floor(1 × 2.0) = 2, EDF order
    assert b is not None and [r.rid for r in b.requests] == [1, 0]
    assert [d.request.rid for d in s.take_drops()] == [3]
    s.on_complete(b, BatchTimings(0.5, 1.5), 1.5)  # 2 requests in 1.0 → moving average (1 + 2) / 2
    b2 = s.next_batch(1.5, 0)  # earliest deadline 6.0 → floor(1.5 × 4.5) = 6, only 1 left
    assert b2 is not None and [r.rid for r in b2.requests] == [2]


def test_nexus_plan_and_early_drop() -> None:
    # Plan: B_max = max b with b ≤ SLO/2; at rate ≥ B_max/ℓ(B_max) the plan is B_max.
    assert NexusScheduler(LAT, 1.0, slo=10.0, rate=2.0).plan_batch == 5
    # Low rate: largest b with (b−1)/λ + b ≤ SLO → 3b − 2 ≤ 10 at λ = 0.5 → 4.
    assert NexusScheduler(LAT, 1.0, slo=10.0, rate=0.5).plan_batch == 4
    s = NexusScheduler(LAT, 1.0, slo=4.0, rate=5.0)
    assert s.plan_batch == 2
    for rid, dl in ((0, 1.5), (1, 3.0), (2, 4.0)):
        s.enqueue(_r(rid, 0.0, dl), 0.0)
    b = s.next_batch(0.0, 0)  # finish = 0 + ℓ(2) = 2 > 1.5: r0 dropped early to keep the batch of 2
    assert b is not None and [r.rid for r in b.requests] == [1, 2]
    assert [(d.request.rid, d.reason) for d in s.take_drops()] == [(0, DropReason.EARLY_DROP)]
    with pytest.raises(ValueError, match="slo > 0"):
        NexusScheduler(LAT, 1.0, slo=0.0, rate=1.0)


def test_clockwork_rejects_the_action_after_an_overrunning_batch() -> None:
    # Mean solo 0.1 s → estimate(1) = 0.1, estimate(2) = 0.2; two requests at t = 0 with SLO 1 s.
    s = ClockworkScheduler(LAT, 0.1, batch_sizes=(1, 2))
    s.enqueue(_r(0, 0.0, 1.0), 0.0)
    s.enqueue(_r(1, 0.0, 1.0), 0.0)
    b = s.next_batch(0.0, 0)  # the b = 2 strategy (priority 0.995 − 0.2) goes first and takes both
    assert b is not None and [r.rid for r in b.requests] == [0, 1]
    s.enqueue(_r(2, 0.05, 1.05), 0.05)
    s.advance(0.05)  # exec_at = 0.2 is beyond now + schedule_ahead: nothing planned yet
    assert s.next_wakeup(0.05) == pytest.approx(0.19)
    s.advance(0.195)  # planned for 0.2 with latest = max(0.195 + 0.011, 0.2 + 0.01) = 0.21
    # The batch really took 0.3 (members longer than the mean): the worker is free at 0.3 > 0.21.
    assert s.next_batch(0.3, 0) is None
    assert [(d.request.rid, d.reason) for d in s.take_drops()] == [(2, DropReason.ACTION_REJECTED)]


def test_clockwork_plans_at_the_time_its_timer_names() -> None:
    # The controller's timer fires at exec_at − schedule_ahead: woken exactly then, it must plan. A strict
    # `exec_at < now + schedule_ahead` never held at the wake-up time, so nothing was planned from the timer
    # and the batch waited for the next arrival or completion.
    s = ClockworkScheduler(LAT, 0.1, batch_sizes=(1,), schedule_ahead=0.01)
    s.enqueue(_r(0, 0.0, 1.0), 0.0)
    first = s.next_batch(0.0, 0)
    assert first is not None and [r.rid for r in first.requests] == [0]
    s.enqueue(_r(1, 0.02, 1.02), 0.02)
    s.advance(0.02)
    wake = s.next_wakeup(0.02)  # exec_at = 0.1 (after the first batch's estimate)
    assert wake is not None
    s.advance(wake)  # the timer fires: the action for r1 is planned now, not at the next event
    assert s.next_wakeup(wake) is None  # r1 is planned: no live request waits for the timer again
    b = s.next_batch(0.1, 0)
    assert b is not None and [r.rid for r in b.requests] == [1]


def test_clockwork_timer_wakeups_plan_in_the_simulator() -> None:
    # Driven by the simulator alone (no other event near exec_at), the second request runs right after
    # the first batch's predicted end, at exec_at, and is not left to the worker's completion.
    import numpy as np
    from tessera.sim.serving.worker_sim import simulate_workers

    s = ClockworkScheduler(LAT, 0.1, batch_sizes=(1,), schedule_ahead=0.01)
    reqs = [Request(0, "m", 0.0, 1.0, solo_time=0.05), Request(1, "m", 0.02, 0.3, solo_time=0.05)]
    st = simulate_workers("clockwork", s, reqs, LAT, rng=np.random.default_rng(0), profile_rate=0.0)
    assert st.finish_rate == 1.0, [(o.request.rid, o.finish, o.drop_reason) for o in st.outcomes]
