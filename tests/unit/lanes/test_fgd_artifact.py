"""FGD as its artifact runs it (hkust-adsl/kubernetes-scheduler-simulator): the typical-pod cut, the integer
node score and ties to the first node, each on a hand-worked case."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tessera.policy.lanes.fragmentation import Measure, Shape, ShapeMix, fgd_integer_score, typical_workload
from tessera.policy.lanes.packing import Fgd
from tessera.sim.packing.experiment import arrivals
from test_fragmentation import state_of

Q = Shape.share(1, 250, cpu_milli=1000)


def test_typical_pods_are_the_most_frequent_shapes_up_to_the_popularity_cut() -> None:
    a, b, c, d = (Shape.share(1, m, cpu_milli=1000) for m in (500, 250, 1000, 100))
    # memory does not tell shapes apart: the five `a` pods are one typical pod
    pods = [Shape.share(1, 500, 1000, memory_mib=i) for i in range(5)] + [b] * 3 + [c, d]
    wl = typical_workload(pods, ["T4"], popularity=0.8)
    assert [(s.gpus, s.compute) for s in wl.shapes] == [(1, 0.5), (1, 0.25)]  # 5 + 3 of 10 pods cover 80 %
    assert wl.weight.tolist() == pytest.approx([5 / 8, 3 / 8])
    assert len(typical_workload(pods, ["T4"], popularity=1.0)) == 4
    assert a.compute == 0.5 and c.compute == 1.0


def test_integer_score_is_the_sigmoid_of_the_decrease_truncated() -> None:
    # ⌊100·σ(−Δ)⌋: no change 50; 0.02 and 0.03 GPU more fragmentation both 49; 0.05 GPU less 51
    got = -fgd_integer_score(np.array([0.0, 0.02, 0.03, -0.05, 5.0]))
    assert got.tolist() == [50.0, 49.0, 49.0, 51.0, 0.0]


def test_integer_scores_tie_nearby_increases_and_the_first_node_wins() -> None:
    # a quarter GPU on 0.28 free leaves 0.03 stranded, on 0.27 free 0.02: the exact rule takes node 1, the
    # artifact's integer scores tie them (49) and its selectHost takes the first node
    wl = ShapeMix([Q], [1.0], ["T4"])
    st = state_of(([0.28], 8000, 8000), ([0.27], 8000, 8000))
    exact = Fgd(wl, Measure.fgd())
    artifact = Fgd(wl, Measure.fgd(), integer_scores=True, first_ties=True)
    for seed in range(5):
        assert exact.choose(st, Q, random.Random(seed)) == (1, (0,))
        assert artifact.choose(st, Q, random.Random(seed)) == (0, (0,))
    # upstream's random tie-break picks either
    random_ties = Fgd(wl, Measure.fgd(), integer_scores=True)
    picks = {random_ties.choose(st, Q, random.Random(seed)) for seed in range(20)}
    assert picks == {(0, (0,)), (1, (0,))}


def test_shuffle_arrivals_take_every_listed_pod_once_first() -> None:
    pods = [Shape.share(1, 100 * k) for k in range(1, 11)]  # 5.5 GPUs in all
    out = arrivals(pods, 8.0, seed=3, mode="shuffle")
    assert sorted(out[:10], key=lambda s: s.compute) == pods
    assert sum(s.gpu_share for s in out) >= 8.0 > sum(s.gpu_share for s in out[:-1])
    with pytest.raises(ValueError):
        arrivals(pods, 8.0, seed=3, mode="nope")
