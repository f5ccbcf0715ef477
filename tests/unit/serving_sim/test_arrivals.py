from pathlib import Path

import numpy as np
import pytest
from tessera.sim.serving.arrivals import (
    cv_from_gamma_shape,
    gamma_arrivals,
    per_minute_arrivals,
    poisson_arrivals,
    read_trace,
    uniform_arrivals,
)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_matches_rate_and_cv(cv: float) -> None:
    a = gamma_arrivals(20.0, cv, 2000.0, np.random.default_rng(1))
    gaps = np.diff(a)
    assert np.all(gaps >= 0)
    assert a[0] >= 0 and a[-1] < 2000.0
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_poisson_is_seeded_and_reproducible() -> None:
    a = poisson_arrivals(5.0, 100.0, np.random.default_rng(7))
    b = poisson_arrivals(5.0, 100.0, np.random.default_rng(7))
    assert np.array_equal(a, b)
    assert 400 < len(a) < 600


def test_per_minute_replay_follows_counts() -> None:
    a = per_minute_arrivals([600, 0, 1200], np.random.default_rng(0), interval=60.0)
    first = np.sum(a < 60)
    assert np.sum((a >= 60) & (a < 120)) == 0
    second = np.sum(a >= 120)
    assert 500 < first < 700 and 1050 < second < 1350


def test_uniform_and_shape() -> None:
    assert list(uniform_arrivals(2.0, 2.0)) == [0.5, 1.0, 1.5, 2.0]
    assert cv_from_gamma_shape(0.25) == pytest.approx(2.0)


def test_bad_parameters_raise() -> None:
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(0.0, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="CV"):
        gamma_arrivals(1.0, 0.0, 1.0, np.random.default_rng(0))


def test_read_trace_csv_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("arrival,app,exec_time\n0.5,b,0.01\n0.1,a,\n")
    rows = read_trace(p)
    assert [(r.arrival, r.app, r.exec_time) for r in rows] == [(0.1, "a", None), (0.5, "b", 0.01)]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival,app\nx,a\n")
    with pytest.raises(ValueError, match="row 2"):
        read_trace(bad)
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival": 1.0, "model": "m"}\n')
    assert read_trace(j)[0].app == "m"
