"""The gateway's online colocation inflation (Symphony beside BE lanes): the tracker's estimate, its band,
and the Symphony scheduler re-planned with the colocated profile."""

from __future__ import annotations

import pytest
from tessera.policy.serving.common import LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler
from tessera.policy.serving.symphony.colocation import InflationTracker, colocated_profile

DEDICATED = LinearProfile(0.01, 0.02, max_batch=8)


def test_estimate_is_the_p99_ratio_after_min_samples_and_moves_only_outside_the_band() -> None:
    t = InflationTracker(DEDICATED, window=100, min_samples=10, band=0.1)
    for _ in range(9):
        assert t.observe(2, 1.5 * DEDICATED(2)) is None  # too few samples
    assert t.observe(4, 1.5 * DEDICATED(4)) == pytest.approx(1.5)
    assert t.current == pytest.approx(1.5)
    for _ in range(50):  # 1.6 is within 10 % of 1.5: no re-plan
        assert t.observe(1, 1.6 * DEDICATED(1)) is None
    # BE lanes leave: once the window holds only dedicated-speed batches, back to 1 (never below)
    new = [t.observe(1, 0.8 * DEDICATED(1)) for _ in range(100)]
    assert [v for v in new if v is not None] == [pytest.approx(1.0)]


def test_p99_ignores_a_rare_outlier_but_not_a_steady_tail() -> None:
    t = InflationTracker(DEDICATED, window=200, min_samples=200, band=0.0)
    for i in range(200):
        t.observe(1, (5.0 if i == 0 else 1.2) * DEDICATED(1))
    assert t.estimate() == pytest.approx(1.2)
    for i in range(200):
        t.observe(1, (2.0 if i % 20 == 0 else 1.2) * DEDICATED(1))
    assert t.estimate() == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kw", [{"min_samples": 0}, {"min_samples": 300}, {"band": -0.1}, {"start": 0.5}, {"quantile": 0.0}]
)
def test_bad_settings_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        InflationTracker(DEDICATED, **kw)  # type: ignore[arg-type]


def test_set_profile_replans_the_waiting_candidate() -> None:
    s = SymphonyScheduler({"m": DEDICATED}, 1)
    s.enqueue(Request(0, "m", 0.0, 1.0, "a"), 0.0)
    s.advance(0.0)
    c = s.candidate("m")
    assert c is not None and c.exec == pytest.approx(1.0 - DEDICATED(2))
    s.set_profile("m", colocated_profile(DEDICATED, 2.0), 0.0)
    c = s.candidate("m")
    assert c is not None and c.exec == pytest.approx(1.0 - 2 * DEDICATED(2))
    (batch,) = s.advance(c.exec)
    assert batch.expected_latency == pytest.approx(2 * DEDICATED(1))
    with pytest.raises(ValueError, match="not served"):
        s.set_profile("other", DEDICATED, 1.0)
