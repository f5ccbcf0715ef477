"""FluidAppRuntime on its own: lease changes re-plan inside the new GPU set; bids follow Fluid's plan."""

import math

import pytest
from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig
from tessera.policy.hpo import GridSearch
from tessera.sim.tuning.fixed_group import FixedHeights
from tessera.sim.tuning.two_level import FluidAppRuntime

TOY = [4.0, 4.0, 12.0, 30.0]


def toy_runtime(cluster: Cluster, d: int = 3) -> FluidAppRuntime:
    alg = GridSearch([{"h": h} for h in TOY], budget=1)
    return FluidAppRuntime(
        cluster, FixedHeights(), alg, FluidConfig(max_pack=2, max_workers=d, dynamic=False)
    )


def test_toy_in_a_five_gpu_lease_matches_static_fluid() -> None:
    cluster = Cluster.homogeneous(2, 4)
    rt = toy_runtime(cluster)
    lease = frozenset(cluster.gpu_ids[2:7])  # 5 GPUs spanning both machines
    rt.set_gpus(0.0, lease)
    assert all(set(p.gpus) <= lease for p in rt.sim.placements)
    t = 0.0
    while not rt.done():
        t = rt.next_event()
        rt.advance(t)
    assert t == pytest.approx(12.0)  # Fig. 3.5: makespan 12 s (the 3-GPU gang stays on one machine)


def test_revoked_gpus_shrink_the_gang_and_progress_is_kept() -> None:
    cluster = Cluster.homogeneous(1, 5)
    rt = toy_runtime(cluster)
    rt.set_gpus(0.0, frozenset(cluster.gpu_ids))
    rt.advance(2.0)
    left_before = rt.remaining_work(2.0)
    gang = next(p.gpus for p in rt.sim.placements if len(p.gpus) == 3)
    keep = frozenset(cluster.gpu_ids) - {gang[0]}
    rt.set_gpus(2.0, keep)
    assert rt.remaining_work(2.0) == pytest.approx(left_before)
    assert all(set(p.gpus) <= keep for p in rt.sim.placements[-1:])
    assert len(rt.sim.placements[-1].gpus) == 2  # a4 continues on the two GPUs it kept
    assert rt.used_gpus() <= keep


def test_bid_answers_follow_fluid_plan() -> None:
    cluster = Cluster.homogeneous(1, 8)
    rt = toy_runtime(cluster, d=8)
    rt.set_gpus(0.0, frozenset(cluster.gpu_ids[:1]))
    assert rt.remaining_time(0, 1.0) == math.inf
    # On 5 GPUs Fluid's plan is w = [1/2, 1/2, 1, 3]: a4 takes 30/3 = 10 s, a3 12 s → 12 s.
    assert rt.remaining_time(5, 1.0) == pytest.approx(12.0)
    assert rt.remaining_time(1, 1.0) == pytest.approx(sum(TOY))  # area bound on one GPU
    assert rt.remaining_time(5, 1.5) == pytest.approx(18.0)
    assert rt.demand() == 8 and rt.peak_demand() == 8


def test_max_gpus_must_fit_the_cluster() -> None:
    cluster = Cluster.homogeneous(1, 2)
    alg = GridSearch([{"h": 1.0}], budget=1)
    with pytest.raises(ValueError, match="max_gpus"):
        FluidAppRuntime(cluster, FixedHeights(), alg, max_gpus=3)
