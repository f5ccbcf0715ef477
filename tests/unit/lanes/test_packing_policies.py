"""The packing baselines of FGD's evaluation (§6.1), one small case each, behind the one interface."""

from __future__ import annotations

import random

import pytest
from tessera.policy.lanes.fragmentation import Shape, ShapeMix
from tessera.policy.lanes.packing import POLICIES, GpuClustering, make_policy
from test_fragmentation import state_of

QUARTER = Shape.share(1, 250, cpu_milli=1000)


def pick(name: str, st: object, shape: Shape, seed: int = 0) -> tuple[int, tuple[int, ...]] | None:
    return make_policy(name, ShapeMix([shape], [1.0], ["T4"])).choose(st, shape, random.Random(seed))  # type: ignore[arg-type]


def test_every_policy_only_picks_feasible_and_none_when_full() -> None:
    for name in POLICIES:
        st = state_of(([0.1, 0.1], 8000, 8000), ([0.3, 0.0], 8000, 8000), ([0.5, 0.2], 500, 8000))
        assert pick(name, st, QUARTER) == (1, (0,)), name
        full = state_of(([0.1], 8000, 8000))
        assert pick(name, full, QUARTER) is None, name


def test_first_fit_takes_first_node_and_lowest_gpu() -> None:
    st = state_of(([0.0, 1.0, 0.3], 8000, 8000), ([0.25], 8000, 8000))
    assert pick("first-fit", st, QUARTER) == (0, (1,))


def test_best_fit_takes_least_left() -> None:
    st = state_of(([1.0, 1.0], 8000, 8000), ([0.3, 1.0], 8000, 8000))
    assert pick("best-fit", st, QUARTER) == (1, (0,))  # tightest GPU within the node too


def test_dot_product_least_alignment() -> None:
    st = state_of(([1.0], 8000, 8000), ([0.4], 8000, 8000))
    assert pick("dot-product", st, QUARTER) == (1, (0,))


def test_gpu_packing_prefers_shared_then_used_node_then_idle() -> None:
    idle, used, shared = ([1.0, 1.0], 8000, 8000), ([0.0, 1.0], 8000, 8000), ([0.5, 1.0], 8000, 8000)
    assert pick("gpu-packing", state_of(idle, used, shared), QUARTER) == (2, (0,))
    assert pick("gpu-packing", state_of(idle, used), QUARTER) == (1, (1,))


def test_gpu_clustering_gathers_equal_requests() -> None:
    st = state_of(([1.0, 1.0], 8000, 8000), ([1.0, 1.0], 8000, 8000), ([1.0, 1.0], 8000, 8000))
    policy = GpuClustering()
    other = Shape.share(1, 500)
    st.take(0, (0,), other)
    policy.placed(st, (0, (0,)), other)
    st.take(1, (0,), QUARTER)
    policy.placed(st, (1, (0,)), QUARTER)
    assert policy.choose(st, QUARTER, random.Random(0)) == (1, (0,))  # same request's node
    assert policy.choose(st, Shape.share(1, 700), random.Random(0))[0] == 2  # a new request: an idle node


def test_random_spreads_over_feasible() -> None:
    st = state_of(*[([1.0], 8000, 8000)] * 4)
    seen = {pick("random", st, QUARTER, seed)[0] for seed in range(40)}  # type: ignore[index]
    assert seen == {0, 1, 2, 3}


def test_gpu_model_constraint() -> None:
    st = state_of(([1.0], 8000, 8000), model="T4")
    r = st.add_row()
    st.set_row(
        r,
        model="V100M32",
        gpu_memory_mib=[32768],
        free_compute=[1.0],
        free_memory_mib=[32768],
        cpu_free=8000,
        memory_free=8000,
        cpu_capacity=8000,
        memory_capacity=8000,
    )
    v100 = Shape(1, 0.5, gpu_memory_frac=0.5, models=frozenset({"V100M32"}))
    for name in POLICIES:
        assert pick(name, st, v100) == (1, (0,)), name


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown packing policy"):
        make_policy("worst-fit", ShapeMix([], [], []))
