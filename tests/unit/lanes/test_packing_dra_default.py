"""kube-scheduler's DRA allocator as a packing policy (tessera.sim.packing.dra_default): the first devices of the
slice that fit, on the node the default scores prefer (issue 30)."""

from __future__ import annotations

import random

from tessera.policy.lanes.fragmentation import Shape
from tessera.policy.lanes.packing import Tessera
from tessera.sim.packing.deployed import AsDeployed, Profile
from tessera.sim.packing.dra_default import MOST_ALLOCATED, DraDefault, first_devices
from test_fragmentation import state_of


def test_the_allocator_takes_the_first_gpus_that_fit_in_slice_order() -> None:
    st = state_of(([0.2, 0.6, 1.0, 0.7], 8000, 16384))
    lane = Shape(1, 0.5, gpu_memory_frac=0.5)
    assert first_devices(st, 0, lane) == (1,)  # not GPU 3, where half a GPU would fit tighter
    assert first_devices(st, 0, Shape(2, 0.5, gpu_memory_frac=0.5)) == (1, 2)
    assert first_devices(st, 0, Shape(1, 1.0, gpu_memory_frac=1.0)) == (2,)
    assert first_devices(st, 0, Shape(0, 0.0, cpu_milli=100)) == ()


def test_default_scores_spread_by_cpu_and_memory_blind_to_gpu_shares() -> None:
    """Node 0 has a half-used GPU and little CPU used; node 1 an idle GPU and more CPU used. LeastAllocated
    sends a half-GPU pod to node 0 (emptier in CPU), whatever its GPUs; MostAllocated to node 1."""
    st = state_of(([0.5], 8000, 16384), ([1.0], 8000, 16384))
    st.cpu[1] = 4000
    pod = Shape(1, 0.5, gpu_memory_frac=0.5, cpu_milli=1000, memory_mib=1024)
    assert DraDefault().choose(st, pod, random.Random(0)) == (0, (0,))
    assert DraDefault(MOST_ALLOCATED).choose(st, pod, random.Random(0)) == (1, (0,))


def test_no_node_with_a_fitting_device_fails_the_pod() -> None:
    st = state_of(([0.3, 0.3], 8000, 16384))
    assert DraDefault().choose(st, Shape(1, 0.5, gpu_memory_frac=0.5), random.Random(0)) is None
    assert DraDefault().choose(st, Shape(0, 0.0, cpu_milli=9000), random.Random(0)) is None


def test_through_the_extender_the_rule_picks_the_node_and_the_allocator_the_device() -> None:
    """tessera-scheduler with `lanes.api: dra`: the extender's priorities (read from the claim) send a half-GPU
    pod to node 0, whose half-free GPU it fills best, though node 0 has less CPU free; the allocator then takes
    node 0's first GPU that fits, GPU 0, not the half-free GPU 1 the rule would have chosen."""
    st = state_of(([1.0, 0.5], 8000, 16384), ([1.0, 1.0], 8000, 16384))
    st.cpu[0] = 2000
    pod = Shape(1, 0.5, gpu_memory_frac=0.5, cpu_milli=1000, memory_mib=1024)
    assert DraDefault().choose(st, pod, random.Random(0)) == (1, (0,))
    prof = Profile("tessera-scheduler", {}, percentage=100, extender_weight=5, extender_all_pods=True)

    def rule() -> Tessera:  # the workload seen: whole-GPU pods besides this one
        r = Tessera()
        for _ in range(4):
            r.distribution.observe(Shape(1, 1.0, gpu_memory_frac=1.0))
        return r

    dra = AsDeployed(prof, prof, rule(), dra=True)
    assert dra.choose(st, pod, random.Random(0)) == (0, (0,))
    assert AsDeployed(prof, prof, rule()).choose(st, pod, random.Random(0)) == (0, (1,))
    assert dra.choose(st, Shape(3, 0.5, gpu_memory_frac=0.5), random.Random(0)) is None
