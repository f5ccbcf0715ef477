"""Model partitioning over scheduler shards (Symphony §4.4, Appendix A)."""

from __future__ import annotations

import random

import pytest
from tessera.policy.serving.symphony.partition import ShardModel, partition_models, random_partition


def _models(n: int, seed: int = 0) -> list[ShardModel]:
    rng = random.Random(seed)
    return [
        ShardModel(f"m{i}", rng.lognormvariate(3, 1), rng.uniform(0.1, 2.0), rng.uniform(0.0, 0.5))
        for i in range(n)
    ]


def test_every_model_once_caps_respected_and_better_than_random() -> None:
    models = _models(200)
    s_max, r_max = 30.0, 1.3 * sum(m.rate for m in models) / 10
    p = partition_models(models, 10, s_max=s_max, r_max=r_max)
    assert sorted(p.assignment) == sorted(m.name for m in models)
    by = {m.name: m for m in models}
    for j in range(10):
        mem = [by[n] for n, k in p.assignment.items() if k == j]
        assert sum(m.rate for m in mem) <= r_max + 1e-9
        assert sum(m.static_mem for m in mem) + max(m.dynamic_mem for m in mem) <= s_max + 1e-9
    rnd = random_partition(models, 10, random.Random(1), tries=500, s_max=s_max, r_max=r_max)
    ours = p.imbalance()
    assert rnd is not None
    assert ours[0] <= rnd.imbalance()[0] and ours[1] <= rnd.imbalance()[1]
    assert ours[0] < 0.05 and ours[1] < 0.2


def test_disruption_budget_moves_at_most_one_model() -> None:
    models = _models(60, seed=3)
    p0 = partition_models(models, 4)
    bumped = [
        ShardModel(m.name, m.rate * (1.5 if i == 0 else 1.0), m.static_mem, m.dynamic_mem)
        for i, m in enumerate(models)
    ]
    p1 = partition_models(bumped, 4, previous=p0.assignment, c_max=1.0)
    moved = [n for n in p0.assignment if p0.assignment[n] != p1.assignment[n]]
    assert len(moved) <= 1
    assert p1.objective <= partition_models(bumped, 4, previous=p0.assignment, c_max=0.0).objective


def test_infeasible_caps_are_reported() -> None:
    with pytest.raises(ValueError, match="fits no partition"):
        partition_models([ShardModel("big", 1.0, 10.0)], 2, s_max=5.0)
    with pytest.raises(ValueError, match="unique"):
        partition_models([ShardModel("a", 1, 1), ShardModel("a", 1, 1)], 2)
