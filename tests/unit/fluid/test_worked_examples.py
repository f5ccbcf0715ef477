"""Spec §4.2.1, 4.2.2, 4.2.4, 4.2.5, 4.2.6: the toy example, the DynamicFluid walk-through, Eq. 3.1/3.2 values."""

from fractions import Fraction as F

import pytest
from tessera.policy.fluid import (
    FluidConfig,
    Rule,
    RuntimeModel,
    choose_packing_degree,
    dynamic_rescale,
    marginal_benefits,
    plan_makespan,
    static_widths,
)

TOY = [4.0, 4.0, 12.0, 30.0]


def test_toy_widths_c2() -> None:
    w = static_widths(TOY, 5, FluidConfig(max_pack=2, max_workers=3))
    assert w == [F(1, 2), F(1, 2), F(1), F(3)]
    assert sum(w) == 5


def test_toy_widths_c3() -> None:
    assert static_widths(TOY, 5, FluidConfig(max_pack=3, max_workers=3)) == [F(1, 3), F(1, 3), F(1), F(3)]


def test_toy_makespan_12_vs_fifo_30() -> None:
    w = static_widths(TOY, 5, FluidConfig(max_pack=2, max_workers=3))
    ideal = [RuntimeModel()] * 4
    assert plan_makespan(TOY, w, ideal) == pytest.approx(12.0)
    assert plan_makespan(TOY, [F(1)] * 4, ideal) == pytest.approx(30.0)  # FIFO: one GPU per trial


def test_switches_turn_mechanisms_off() -> None:
    assert static_widths(TOY, 5, FluidConfig(max_pack=2, max_workers=3, intra_gpu=False)) == [1, 1, 1, 3]
    assert static_widths(TOY, 5, FluidConfig(max_pack=2, max_workers=3, inter_gpu=False)) == [
        F(1, 2),
        F(1, 2),
        1,
        1,
    ]


def test_dynamic_t4_no_change() -> None:
    # a1, a2 done; a3 has 8 s left at width 1, a4 18 s at width 1 (12 GPU·s consumed on 3 GPUs)
    out = dynamic_rescale([F(1), F(3)], [8.0, 18.0], 5, FluidConfig(max_pack=2, max_workers=3))
    assert [(r.index, r.proposed, r.rule) for r in out] == [(1, 3, Rule.KEEP), (0, 1, Rule.KEEP)]


@pytest.mark.parametrize(("d", "makespan"), [(3, 10 + 2 / 3), (5, 10.4)])
def test_dynamic_t10_scale_up(d: int, makespan: float) -> None:
    (r,) = dynamic_rescale([F(1)], [2.0], 5, FluidConfig(max_pack=2, max_workers=d))
    assert r.rule == Rule.SCALE_UP and r.width == d
    assert 10 + RuntimeModel().height(2.0, r.width) == pytest.approx(makespan)


def test_dynamic_scale_up_rejected_when_epsilon_too_big() -> None:
    (r,) = dynamic_rescale([F(1)], [2.0], 5, FluidConfig(max_workers=3, epsilon=4 / 3))
    assert r.rule == Rule.KEEP
    (r,) = dynamic_rescale([F(1)], [2.0], 5, FluidConfig(max_workers=3, epsilon=1.3))
    assert r.rule == Rule.SCALE_UP


def test_scale_down_never_fires_with_linear_speedup() -> None:
    # w = 4 → w' = 2 on n = 2: with β = 1 and ε > 0 the area cannot shrink (§4.2.6)
    (r,) = dynamic_rescale([F(4)], [100.0], 2, FluidConfig(max_workers=4, epsilon=0.1))
    assert r.proposed == 2 and r.rule == Rule.KEEP
    # with β > 1 it fires iff w'ε < h1(β^{w−1} − β^{w'−1}): 2·0.1 < 100·(1.1^3 − 1.1) = 23.1
    (r,) = dynamic_rescale(
        [F(4)], [100.0], 2, FluidConfig(max_workers=4, epsilon=0.1), [RuntimeModel(beta=1.1)]
    )
    assert r.rule == Rule.SCALE_DOWN and r.width == 2


def test_eq_3_2_values() -> None:
    m = RuntimeModel(alpha=1.2, beta=1.1)
    assert m.height(100, F(1, 2)) == pytest.approx(120)
    assert m.height(100, F(1, 3)) == pytest.approx(144)
    assert m.height(100, 1) == pytest.approx(100)
    assert m.height(100, 2) == pytest.approx(55)
    assert m.height(100, 4) == pytest.approx(33.275)


def test_eq_3_2_ranges() -> None:
    RuntimeModel(alpha=1.9).check_ranges(c=2, d=1)
    with pytest.raises(ValueError, match="alpha < c/\\(c-1\\)"):
        RuntimeModel(alpha=1.5).check_ranges(c=3, d=1)
    with pytest.raises(ValueError, match="beta < 1 \\+ 1/d"):
        RuntimeModel(beta=1.25).check_ranges(c=1, d=4)
    with pytest.raises(ValueError, match=">= 1"):
        RuntimeModel(alpha=0.9)


def test_eq_3_1_values() -> None:
    o = marginal_benefits([100, 120, 170, 260])
    assert o == pytest.approx([0.4, 0.0556, -0.147], abs=5e-4)
    assert choose_packing_degree([100, 120, 170, 260], 0.05) == 3
    assert choose_packing_degree([100, 120, 170, 260], 0.1) == 2
    assert choose_packing_degree([100, 120, 170, 260], 0.4) == 1


def test_ten_x_packing_overhead_gives_c1() -> None:
    assert choose_packing_degree([100, 1000, 2000]) == 1


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one GPU"):
        static_widths([1.0], 0, FluidConfig())
    with pytest.raises(ValueError, match="finite"):
        static_widths([float("nan")], 2, FluidConfig())
    with pytest.raises(ValueError, match="max_pack"):
        FluidConfig(max_pack=0)
    with pytest.raises(ValueError, match="avg\\(T\\^2\\)"):
        marginal_benefits([100, 0])
