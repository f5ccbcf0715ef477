"""The toy example and the §4.2.2 walk-through executed end to end by the simulator."""

import pytest
from tessera.policy.fluid import FluidConfig
from tessera.sim.tuning.fixed_group import FixedHeights, simulate_group

TOY = [4.0, 4.0, 12.0, 30.0]


def test_toy_static_12_fifo_30() -> None:
    assert simulate_group(
        TOY, 5, FluidConfig(max_pack=2, max_workers=3, dynamic=False)
    ).makespan == pytest.approx(12)
    assert simulate_group(TOY, 5, FluidConfig(), executor="fifo").makespan == pytest.approx(30)


@pytest.mark.parametrize(("d", "makespan"), [(3, 10 + 2 / 3), (5, 10.4)])
def test_toy_dynamic(d: int, makespan: float) -> None:
    assert simulate_group(TOY, 5, FluidConfig(max_pack=2, max_workers=d)).makespan == pytest.approx(makespan)


def test_toy_dynamic_epsilon_blocks_scale_up() -> None:
    cfg = FluidConfig(max_pack=2, max_workers=3, epsilon=1.5)
    assert simulate_group(TOY, 5, cfg).makespan == pytest.approx(12)


def test_packing_overhead_slows_packed_trials() -> None:
    r = simulate_group(
        TOY, 5, FluidConfig(max_pack=2, max_workers=3, dynamic=False), model=FixedHeights(alpha=1.5)
    )
    assert r.makespan == pytest.approx(12)  # a1, a2 take 6 s packed, a3 is still the straggler
    r = simulate_group([10.0, 10.0], 1, FluidConfig(max_pack=2), model=FixedHeights(alpha=1.5))
    assert r.makespan == pytest.approx(15)  # both packed on the one GPU: 10 · 1.5
