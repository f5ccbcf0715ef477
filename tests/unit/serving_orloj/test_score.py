"""Orloj Eq. 2 against values derived by integration and Monte-Carlo."""

import math

import numpy as np
import pytest
from tessera.policy.serving.orloj import BatchDistribution, ScoreTable, hull_coeffs, score, scores_by_slack


def _dist(l1: list[float], l2: list[float], mass: list[float], mean: float) -> BatchDistribution:
    return BatchDistribution(1, np.array(l1), np.array(l2), np.array(mass), mean)


SINGLE = _dist([10.0], [20.0], [1.0], 15.0)


@pytest.mark.parametrize(
    ("t", "expected"),
    [(0, 0.028506), (50, 0.046999), (79.9, 0.063378), (80, 0.063442), (85, 0.032514), (89.99, 6.7e-05)],
)
def test_single_bin_values(t: float, expected: float) -> None:
    table = ScoreTable.build(SINGLE, b=0.01)
    assert score(table, 100 - t) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("t", [90, 95, 120])
def test_zero_once_slack_below_lower_edge(t: float) -> None:
    assert score(ScoreTable.build(SINGLE, b=0.01), 100 - t) == 0.0


def test_monte_carlo_definition_matches_eq2() -> None:
    """Eq. 1 directly: c·P(L ≤ D−t < L+τ)/E[L] with L ~ U[10,20), τ ~ Exp(b)."""
    rng = np.random.default_rng(0)
    n = 400_000
    L = rng.uniform(10, 20, n)
    tau = rng.exponential(1 / 0.01, n)
    for t in (0.0, 50.0, 85.0):
        s = 100 - t
        mc = np.mean((s >= L) & (s < L + tau)) / 15.0
        assert score(ScoreTable.build(SINGLE, b=0.01), s) == pytest.approx(mc, abs=2e-4)


def test_continuous_at_milestones() -> None:
    d = _dist([10, 20, 35], [20, 30, 45], [0.3, 0.5, 0.2], 24.0)
    table = ScoreTable.build(d, b=0.05)
    for edge in (10, 20, 30, 35, 45):
        lo, hi = score(table, edge - 1e-9), score(table, edge + 1e-9)
        assert lo == pytest.approx(hi, abs=1e-7)


def test_toy_ordering_and_hull_coefficients() -> None:
    d = _dist([10, 20], [20, 30], [0.5, 0.5], 20.0)
    table = ScoreTable.build(d, b=0.01)
    want = {
        0: (0.041005, 0.033572, 0.022504),
        15: (0.034823, 0.039005, 0.026146),
        25: (0.012193, 0.043107, 0.028896),
    }
    for t, vals in want.items():
        got = scores_by_slack(table, np.array([40.0, 60.0, 100.0]) - t)
        assert got == pytest.approx(vals, abs=1e-6)
    a, b_, _ = hull_coeffs(d, 40, 0, b=0.01)
    assert (a, b_) == pytest.approx((0.0410048, 0.0), abs=1e-7)
    for t in (10, 15, 29.9):
        a, b_, _ = hull_coeffs(d, 40, t, b=0.01)
        assert (a, b_) == pytest.approx((-0.18520456, 0.25), abs=1e-7)
    assert hull_coeffs(d, 40, 30, b=0.01)[:2] == (0.0, 0.0)


def test_hull_form_equals_slack_form_and_is_base_time_invariant() -> None:
    d = _dist([10, 20], [20, 30], [0.5, 0.5], 20.0)
    table = ScoreTable.build(d, b=0.01)
    for t in (0.0, 12.0, 17.0, 26.0):
        for t0 in (0.0, 37.5):
            a, b_, _ = hull_coeffs(d, 60, t, b=0.01, t0=t0)
            assert a * math.exp(0.01 * (t - t0)) + b_ == pytest.approx(
                score(table, 60 - t), rel=1e-9, abs=1e-15
            )


def test_scores_before_all_milestones_are_edf_and_cost_scales() -> None:
    d = _dist([10, 20], [20, 30], [0.5, 0.5], 20.0)
    s1 = scores_by_slack(ScoreTable.build(d, b=0.01), np.array([40.0, 60.0, 100.0]))
    s2 = scores_by_slack(ScoreTable.build(d, b=0.01, cost=3.0), np.array([40.0, 60.0, 100.0]))
    assert list(np.argsort(-s1)) == [0, 1, 2]
    assert s2 == pytest.approx(3 * s1)
