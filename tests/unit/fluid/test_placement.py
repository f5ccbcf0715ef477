"""Placement on concrete GPUs: lanes for packed trials, same-machine gangs for multi-GPU trials."""

from fractions import Fraction

import pytest
from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig, TrialDemand, choose_gang, place, plan_trial_group

TOY = [TrialDemand(f"a{i + 1}", h) for i, h in enumerate([4.0, 4.0, 12.0, 30.0])]


def test_toy_placement_on_two_machines() -> None:
    cluster = Cluster.homogeneous(machines=2, gpus_per_machine=4)
    gpus = ["m000/0", "m000/1", "m001/0", "m001/1", "m001/2"]  # 2 + 3 GPUs of a lease
    p = plan_trial_group(cluster, gpus, TOY, FluidConfig(max_pack=2, max_workers=3))
    assert p.gangs["a4"] == ("m001/0", "m001/1", "m001/2")  # the only machine with 3 free
    assert len(p.gangs["a3"]) == 1 and p.gangs["a3"][0].startswith("m000")
    (packed_gpu,) = [g for g, ls in p.lanes.items() if ls]
    lanes = p.lanes[packed_gpu]
    assert {lane.trial_id for lane in lanes} == {"a1", "a2"}
    assert all(lane.compute_percent == 50 and lane.memory_mib == 8192 for lane in lanes)
    assert p.queued == ()
    assert len(p.used_gpus()) == 5


def test_gang_spreads_over_fewest_machines() -> None:
    cluster = Cluster.homogeneous(machines=3, gpus_per_machine=4)
    free = ["m000/0", "m001/0", "m001/1", "m001/2", "m002/0", "m002/1"]
    gang = choose_gang(cluster, free, 5)
    assert sorted({g.split("/")[0] for g in gang}) == ["m001", "m002"]
    assert choose_gang(cluster, free, 2) == ["m002/0", "m002/1"]  # best fit, not the bigger machine


def test_extra_small_trials_queue_in_order() -> None:
    cluster = Cluster.homogeneous(1, 2)
    demands = [TrialDemand(f"t{i}", h) for i, h in enumerate([5, 4, 3, 2, 1, 6])]
    p = plan_trial_group(cluster, cluster.gpu_ids, demands, FluidConfig(max_pack=2))
    assert p.queued == ("t3", "t4")
    assert all(len(ls) == 2 for ls in p.lanes.values())


def test_declared_memory_limits_packing() -> None:
    cluster = Cluster.homogeneous(1, 2, memory_mib=10000)
    demands = [TrialDemand("big", 2, memory_mib=7000), TrialDemand("b2", 2, memory_mib=7000)]
    p = place(cluster, cluster.gpu_ids, demands, [Fraction(1, 2)] * 2, 2)
    assert sorted(len(ls) for ls in p.lanes.values()) == [1, 1]
    with pytest.raises(ValueError, match="more than any of its GPUs"):
        place(cluster, cluster.gpu_ids, [TrialDemand("x", 1, memory_mib=20000)], [Fraction(1, 2)], 2)


def test_existing_lanes_are_joined() -> None:
    cluster = Cluster.homogeneous(1, 2)
    first = place(cluster, ["m000/0"], [TrialDemand("a", 1)], [Fraction(1, 2)], 2)
    assert first.gangs == {} and len(first.lanes["m000/0"]) == 1
    p = place(
        cluster, cluster.gpu_ids, [TrialDemand("b", 1)], [Fraction(1, 2)], 2, existing_lanes=first.lanes
    )
    assert [lane.trial_id for lane in p.lanes["m000/0"]] == ["a", "b"]


def test_unknown_gpu_is_an_error() -> None:
    with pytest.raises(KeyError, match="unknown GPU"):
        plan_trial_group(Cluster.homogeneous(1, 1), ["nope"], TOY, FluidConfig())
