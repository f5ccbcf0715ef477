"""Batch execution-time distributions against Orloj Eq. (3)-(9) and the Fig. 4.6 toy example."""

import numpy as np
import pytest
from tessera.policy.serving.common import BatchLatencyModel
from tessera.policy.serving.orloj import CountHistogram, MixMode, batch_distribution
from tessera.policy.serving.orloj.batch_dist import max_cdf

EQ3 = BatchLatencyModel.eq3(2.0, 0.5)


@pytest.mark.parametrize(
    ("k", "masses", "bins", "mean"),
    [
        (1, (0.5, 0.5), ((7, 7.5), (17, 17.5)), 12.25),
        (2, (0.25, 0.75), ((12, 13), (32, 33)), 27.5),
        (4, (0.0625, 0.9375), ((22, 24), (62, 64)), 60.5),
    ],
)
def test_same_distribution_table(k: int, masses: tuple[float, float], bins: tuple, mean: float) -> None:
    h = CountHistogram.from_samples([10.0, 30.0], 1.0)
    d = batch_distribution(k, {"a": h}, EQ3)
    assert list(d.mass) == pytest.approx(masses)
    assert [(float(a), float(b)) for a, b in zip(d.l1, d.l2, strict=True)] == list(bins)
    assert d.mean == pytest.approx(mean)


def test_different_distributions_max() -> None:
    h1 = CountHistogram.from_samples([1.0, 3.0], 1.0)
    h2 = CountHistogram.from_samples([2.0], 1.0)
    d = batch_distribution(2, {"x1": h1, "x2": h2}, BatchLatencyModel(s0=1.0, s1=0.0))
    assert list(d.l1) == [2.0, 3.0]
    assert list(d.mass) == pytest.approx([0.5, 0.5])
    assert d.mean == pytest.approx(3.0)  # midpoints of [2,3) and [3,4): E = 2.5 + half a bin


def test_toy_right_skew() -> None:
    # D1 = {0.5: .2, 1.0: .6, 1.5: .2}, D2 = {0.25: .5, 1.75: .5}; bins of 0.25; max has E = 1.4 (+ half bin)
    h1 = CountHistogram.from_samples([0.5] * 2 + [1.0] * 6 + [1.5] * 2, 0.25)
    h2 = CountHistogram.from_samples([0.25, 1.75], 0.25)
    d = batch_distribution(2, {"d1": h1, "d2": h2}, BatchLatencyModel(s0=1.0, s1=0.0))
    assert dict(zip(d.l1.tolist(), d.mass.tolist(), strict=True)) == pytest.approx(
        {0.5: 0.1, 1.0: 0.3, 1.5: 0.1, 1.75: 0.5}
    )
    # Exact mean of the point masses is 1.375, which the spec rounds to 1.4.
    assert d.mean - 0.125 == pytest.approx(1.375)
    assert d.mean - 0.125 == pytest.approx(1.4, abs=0.03)
    assert d.mean - 0.125 > 1.025


def test_eq8_equals_product_rule() -> None:
    """Ryser form of Eq. 8 vs d/dl Π F_i for U(0,2), U(1,3), U(0.5,4) (§6.2)."""
    from itertools import combinations
    from math import factorial

    bounds = [(0, 2), (1, 3), (0.5, 4)]
    F = [lambda x, a=a, b=b: min(max((x - a) / (b - a), 0), 1) for a, b in bounds]
    f = [lambda x, a=a, b=b: 1 / (b - a) if a <= x < b else 0.0 for a, b in bounds]
    k = 3
    for x, want in ((1.5, 0.196429), (2.5, 0.5), (3.5, 0.285714)):
        eq8 = 0.0
        for kappa in range(1, k + 1):
            for s in combinations(range(k), kappa):
                Fs = sum(F[i](x) for i in s) / kappa
                fs = sum(f[i](x) for i in s) / kappa
                eq8 += (-1) ** (k - kappa) * kappa**k / factorial(k) * k * Fs ** (k - 1) * fs
        prod = sum(f[i](x) * np.prod([F[j](x) for j in range(k) if j != i]) for i in range(k))
        assert eq8 == pytest.approx(want, abs=1e-6)
        assert prod == pytest.approx(want, abs=1e-6)


def test_properties() -> None:
    rng = np.random.default_rng(3)
    ha = CountHistogram.from_samples(rng.normal(50, 5, 500).clip(1), 1.0)
    hb = CountHistogram.from_samples(rng.normal(100, 5, 500).clip(1), 1.0)
    lat = BatchLatencyModel(s0=0.8, s1=0.2)
    means = [batch_distribution(k, {"a": ha, "b": hb}, lat).mean for k in (1, 2, 4, 8)]
    assert means == sorted(means)
    assert batch_distribution(4, {"a": ha, "b": hb}, BatchLatencyModel(s0=1.0, s1=0.0)).mean >= max(
        ha.mean(), hb.mean()
    )
    n = max(ha.counts.size, hb.counts.size)
    rr = max_cdf([ha.cdf_at_edges(n), hb.cdf_at_edges(n)] * 2)
    mix = ((ha.cdf_at_edges(n) + hb.cdf_at_edges(n)) / 2) ** 4
    assert np.all(rr <= mix + 1e-12)
    w = batch_distribution(2, {"a": ha, "b": hb}, lat, mode=MixMode.WEIGHTED, weights={"a": 1.0, "b": 0.0})
    assert w.mean == pytest.approx(batch_distribution(2, {"a": ha}, lat).mean)
    with pytest.raises(ValueError, match="weights"):
        batch_distribution(2, {"a": ha}, lat, mode=MixMode.WEIGHTED)
