"""The as-deployed packing model (tessera.sim.packing.deployed): kube-scheduler's share of nodes searched,
its resource scores, and the profiles read from the shipped scheduler configuration."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from tessera.policy.lanes.fragmentation import Shape
from tessera.policy.lanes.packing import PackingConfig
from tessera.sim.packing.deployed import (
    DEFAULT_SCHEDULER,
    AsDeployed,
    nodes_to_find,
    plugin_scores,
    profile_from_config,
)
from test_fragmentation import state_of

CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "scheduler" / "kube-scheduler-config.yaml"


def test_nodes_to_find_is_kube_schedulers_adaptive_share() -> None:
    # 50 − n/125 percent, at least 100 nodes; all of a small cluster or at 100 %
    assert nodes_to_find(1213, 0) == 1213 * 41 // 100 == 497
    assert nodes_to_find(5000, 0) == 5000 * 10 // 100
    assert nodes_to_find(150, 0) == 100
    assert nodes_to_find(80, 0) == 80
    assert nodes_to_find(1213, 100) == 1213


def test_shipped_profile_leaves_the_extender_alone() -> None:
    prof = profile_from_config(yaml.safe_load(CONFIG.read_text()), "tessera-scheduler")
    assert prof.weights == {}  # no resource score tells nodes apart
    assert prof.percentage == 100 and prof.extender_all_pods and prof.extender_weight > 0
    with pytest.raises(ValueError):
        profile_from_config(yaml.safe_load(CONFIG.read_text()), "nope")


def test_least_allocated_and_balanced_scores_by_hand() -> None:
    # node 0: 8 CPUs / 16 GiB free of the same; node 1: 2 CPUs / 4 GiB free of 8 / 16 GiB
    st = state_of(([1.0], 8000, 16384), ([1.0], 8000, 16384))
    st.cpu[1], st.mem[1] = 2000, 4096
    pod = Shape(0, 0.0, cpu_milli=2000, memory_mib=4096)
    # LeastAllocated: node 0 ⌊(75 + 75) / 2⌋ = 75, node 1 0 left ⇒ 0; Balanced: CPU and memory equal ⇒ 100
    got = plugin_scores(st, np.array([0, 1]), pod, DEFAULT_SCHEDULER)
    assert got.tolist() == [75 + 100, 0 + 100]


def test_spreading_cpu_pods_strand_gpus_that_the_rule_keeps() -> None:
    """Two nodes of 8 CPUs and one idle GPU, 6 and 3 CPUs free; the workload is half-GPU pods needing 4 CPUs.
    A 3-CPU pod by default-scheduler goes to the emptier node (LeastAllocated), where it leaves 3 CPUs and the
    GPU strands; routed through tessera-scheduler the rule puts it where the GPU is already out of reach."""
    st = state_of(([1.0], 6000, 64000), ([1.0], 3000, 64000))
    st.cpu_cap[:2] = 8000
    st.mem_cap[:2] = 64000
    prof = profile_from_config(yaml.safe_load(CONFIG.read_text()), "tessera-scheduler")
    prior = ((Shape.share(1, 500, cpu_milli=4000), 100.0),)
    pod = Shape(0, 0.0, cpu_milli=3000)
    spread = AsDeployed(prof, DEFAULT_SCHEDULER, PackingConfig(prior=prior).policy())
    routed = AsDeployed(prof, prof, PackingConfig(prior=prior).policy())
    assert spread.choose(st, pod, random.Random(0)) == (0, ())
    assert routed.choose(st, pod, random.Random(0)) == (1, ())


def test_the_search_resumes_where_it_stopped() -> None:
    st = state_of(*[([1.0], 8000, 8000)] * 300)
    prof = DEFAULT_SCHEDULER  # adaptive: 144 of 300 nodes (48 %), LeastAllocated ties broken at random
    policy = AsDeployed(prof, prof, PackingConfig().policy())
    rows = [policy.choose(st, Shape(0, 0.0, cpu_milli=100), random.Random(k)) for k in range(3)]
    got = [r[0] for r in rows if r is not None]
    assert got[0] < 144 <= got[1] < 288 and not 132 <= got[2] < 288, got
