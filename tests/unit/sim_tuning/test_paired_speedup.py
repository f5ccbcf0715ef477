"""paired_speedup: the ratio the Fluid reproduction reports, over the seeds both executors reached."""

import pytest
from tessera.sim.tuning.engine import TuningResult
from tessera.sim.tuning.experiments import paired_speedup


def _r(ttt: float | None, makespan: float = 100.0) -> TuningResult:
    return TuningResult("asha", "x", 8, makespan, ttt, 0.0, 0.0, 0.0, 0, 0)


def test_ratio_of_sums_over_seeds_both_reached() -> None:
    base = [_r(30.0), _r(10.0), _r(None), _r(50.0)]
    other = [_r(20.0), _r(10.0), _r(5.0), _r(None)]
    s = paired_speedup(base, other, "time_to_target")
    assert s.ratio == pytest.approx(40.0 / 30.0)  # seeds 0 and 1 only
    assert (s.paired, s.base_reached, s.other_reached) == (2, 3, 3)
    assert s.low <= s.ratio <= s.high
    assert s.low >= 1.0 and s.high <= 1.5  # resampling two pairs: 1.0, 4/3 or 1.5


def test_refuses_unpaired_or_empty_input() -> None:
    with pytest.raises(ValueError, match="same seeds"):
        paired_speedup([_r(1.0)], [], "time_to_target")
    with pytest.raises(ValueError, match="lower the workload target"):
        paired_speedup([_r(None)], [_r(2.0)], "time_to_target")
