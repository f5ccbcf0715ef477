"""Orion's policy pieces: Listing 1 (spec E.8), profiling (E.9), cost saving, bisection controllers (E.10)."""

from __future__ import annotations

import itertools
import math

import pytest
from tessera.policy.orion.controller import PBeController, SmThresholdBisection
from tessera.policy.orion.cooperative import ThrottleRule
from tessera.policy.orion.listing1 import BeKernel, OrionConfig, OrionPolicy
from tessera.policy.orion.profiles import (
    KernelShare,
    Profile,
    blocks_per_sm,
    classify,
    cost_saving,
    initial_be_percent,
    sm_needed,
)

C, M, U = Profile.COMPUTE, Profile.MEMORY, Profile.UNKNOWN


@pytest.mark.parametrize(
    ("running", "sm", "hp", "be", "admit"),
    [
        (False, 784, C, C, True),
        (True, 49, M, C, True),
        (True, 49, C, C, False),
        (True, 784, M, C, False),
        (True, 49, C, U, True),
        (True, 49, U, M, True),
    ],
)
def test_schedule_be_truth_table(running: bool, sm: int, hp: Profile, be: Profile, admit: bool) -> None:
    pol = OrionPolicy(OrionConfig(num_sms=80), hp_latency=6.4e-3)
    assert pol.schedule_be(running, hp, BeKernel(sm, be, 1e-5)) is admit


def test_sm_check_is_inclusive_and_accumulates_within_a_round() -> None:
    pol = OrionPolicy(OrionConfig(num_sms=80), hp_latency=1.0)
    assert pol.admit(True, M, BeKernel(80, C, 1e-6), be_all_done=True)  # 80 <= 80 (code's <=)
    assert not pol.admit(True, M, BeKernel(1, C, 1e-6), be_all_done=True)  # 80 + 1 > 80 this round
    pol.new_round()
    assert pol.admit(True, M, BeKernel(1, C, 1e-6), be_all_done=True)


def test_dur_threshold_throttle_blocks_until_outstanding_work_completes() -> None:
    pol = OrionPolicy(OrionConfig(), hp_latency=6.4e-3)
    assert math.isclose(pol.dur_threshold, 160e-6)
    assert pol.admit(False, None, BeKernel(10, C, 100e-6), be_all_done=True)
    assert pol.admit(False, None, BeKernel(10, C, 80e-6), be_all_done=False)  # 180 µs > 160 µs now
    assert not pol.admit(False, None, BeKernel(10, C, 10e-6), be_all_done=False)
    assert pol.admit(False, None, BeKernel(10, C, 10e-6), be_all_done=True)  # reset and launched
    assert math.isclose(pol.be_duration, 10e-6)


def test_sm_threshold_bisection_follows_the_code() -> None:
    b = SmThresholdBisection(784)
    assert b.threshold == 392
    assert b.observe(hp_too_slow=True) == 196
    assert b.observe(hp_too_slow=False) == 294


@pytest.mark.parametrize(
    ("ded", "col", "saving"),
    [(10.3, 7.45, 1.45), (12.5, 8.78, 1.40), (6.3, 4.7, 1.49), (4.91, 3.1, 1.26), (6, 3.9, 1.30)],
)
def test_cost_saving_table4(ded: float, col: float, saving: float) -> None:
    assert round(cost_saving(col, ded), 2) == saving


def test_sm_needed_and_blocks_per_sm() -> None:
    assert blocks_per_sm(256, 32) == 8
    assert sm_needed(196, 256, 32) == 25
    assert blocks_per_sm(96, 32) == 21  # floor (CUDA occupancy); the authors' script's ceil gives 22


def test_classify() -> None:
    assert classify(0.1, 0.1, arithmetic_intensity=12.0) is C
    assert classify(0.9, 0.9, arithmetic_intensity=3.0) is M
    assert classify(0.65, 0.2) is C
    assert classify(0.2, 0.70) is M
    assert classify(0.5, 0.5) is U


def test_initial_be_percent_clamped() -> None:
    assert initial_be_percent([KernelShare(1.0, 0.9)]) == 10
    assert initial_be_percent([KernelShare(1.0, 0.2)]) == 50
    assert initial_be_percent([KernelShare(1.0, 0.7), KernelShare(3.0, 0.65)]) == 35


def _p99(p_be: float) -> float:
    """A synthetic HP p99 that rises with the BE share: 10 ms dedicated, +0.5% per point past 20%."""
    return 10.0 * (1 + max(0.0, p_be - 20) * 0.005)


def test_p_be_bisection_converges_without_flapping() -> None:
    ctl = PBeController(p99_dedicated=10.0, epsilon=0.15, initial=50, min_interval_s=60, hysteresis=3)
    # target 11.5 ms ↔ p_be ≤ 50; start above: p99(80) = 13 ms
    ctl.applied = 80
    now, applied = 0.0, []
    for _ in range(40):
        d = ctl.observe(now, _p99(ctl.applied))
        if d.apply is not None:
            applied.append((now, d.apply, d.reason))
        now += 30
    assert len(applied) <= 7  # ⌈log2(100)⌉ changes at most
    assert all(b - a >= 60 for (a, *_), (b, *_) in itertools.pairwise(applied))  # min interval
    final = ctl.applied
    assert _p99(final) <= ctl.target and final >= 50 - 2 * ctl.hysteresis
    tail = [d for d in applied if d[0] > now / 2]
    assert not tail  # settled: no changes in the second half


def test_p_be_reopens_when_load_changes() -> None:
    ctl = PBeController(p99_dedicated=10.0, initial=40, min_interval_s=0, hysteresis=2)
    for i in range(10):
        ctl.observe(float(i), _p99(ctl.applied))
    settled = ctl.applied
    for i in range(10, 30):  # the HP got more sensitive: now only p_be ≤ 30 is fine
        ctl.observe(float(i), 10.0 * (1 + max(0.0, ctl.applied - 20) * 0.015))
    assert ctl.applied < settled and 10.0 * (1 + max(0.0, ctl.applied - 20) * 0.015) <= ctl.target


def test_controller_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="p99_dedicated"):
        PBeController(p99_dedicated=0)
    with pytest.raises(ValueError, match="initial"):
        PBeController(p99_dedicated=1, initial=120)


def test_throttle_rule() -> None:
    r = ThrottleRule.for_hp_latency(6.4e-3)
    assert math.isclose(r.threshold_s, 160e-6)
    assert r.may_launch(True, 1.0, 0)  # nothing outstanding: launch
    assert not r.may_launch(True, 200e-6, 1)
    assert r.may_launch(True, 100e-6, 1)
    assert r.may_launch(False, 1.0, 11) and not r.may_launch(False, 0.0, 12)
