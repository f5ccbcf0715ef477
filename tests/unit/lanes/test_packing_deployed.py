"""The as-deployed packing model (tessera.sim.packing.deployed): kube-scheduler's share of nodes searched,
its resource scores, and the profiles read from the shipped scheduler configuration."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tessera.api import contract
from tessera.policy.lanes.fragmentation import Shape
from tessera.policy.lanes.packing import PackingConfig
from tessera.sim.packing.deployed import (
    DEFAULT_SCHEDULER,
    AsDeployed,
    from_chart,
    nodes_to_find,
    plugin_scores,
    profile_from_config,
    selects,
)
from test_fragmentation import state_of

from tests.unit.chart.chart_render import NAMESPACE, objects, render

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


# --- routing read from the rendered chart (gpuNodes.reserve) ------------------------------------------------

LABELLED = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}


def chart(values: dict[str, Any] | None, namespace: str = "ml", labels: dict[str, str] = LABELLED) -> Any:
    return from_chart(objects(render(values)), namespace, labels)


def test_chart_defaults_leave_cpu_only_pods_to_default_scheduler() -> None:
    got = chart(None)
    assert got.gpu_profile.scheduler == "tessera-scheduler" and got.gpu_profile.extender_all_pods
    assert got.cpu_profile == DEFAULT_SCHEDULER and not got.gpu_nodes_reserved and not got.routed


def test_reserve_routes_the_labelled_namespace_through_tessera_scheduler() -> None:
    reserve = {"gpuNodes": {"reserve": True}}
    got = chart(reserve)
    assert got.routed and got.gpu_nodes_reserved and got.cpu_profile == got.gpu_profile
    # Not labelled, the release's own namespace, or routing left to the admin: tainted, not routed.
    for deployment in (
        chart(reserve, labels={}),
        chart(reserve, namespace=NAMESPACE),
        chart({"gpuNodes": {"reserve": True, "admissionPolicy": False}}),
    ):
        assert deployment.gpu_nodes_reserved and deployment.cpu_profile == DEFAULT_SCHEDULER
    # The chart's scheduler name is the one the policy writes.
    renamed = chart({**reserve, "scheduler": {"schedulerName": "gpu-share"}})
    assert renamed.routed and renamed.cpu_profile.scheduler == "gpu-share"


def test_label_selectors_as_the_api_server_applies_them() -> None:
    labels = {"team": "ml"}
    assert selects({"matchLabels": {"team": "ml"}}, "a", labels)
    assert not selects({"matchLabels": {"team": "ops"}}, "a", labels)
    name_not_in = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    assert selects({"matchExpressions": [name_not_in]}, "a", labels)
    assert not selects({"matchExpressions": [name_not_in]}, "kube-system", labels)
    assert selects(
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml", "x"]}]}, "a", labels
    )
    assert selects({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, "a", labels)
    assert not selects({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, "a", labels)
    with pytest.raises(ValueError, match="'Gt' is not one of"):
        selects({"matchExpressions": [{"key": "team", "operator": "Gt"}]}, "a", labels)


def test_reserved_gpu_nodes_take_no_pod_of_default_scheduler() -> None:
    # Node 0 has a GPU and is emptier (LeastAllocated prefers it); node 1 has none.
    st = state_of(([1.0], 8000, 64000), ([], 2000, 64000))
    prof = profile_from_config(yaml.safe_load(CONFIG.read_text()), "tessera-scheduler")
    pod = Shape(0, 0.0, cpu_milli=1000)
    open_nodes = AsDeployed(prof, DEFAULT_SCHEDULER, PackingConfig().policy())
    reserved = AsDeployed(prof, DEFAULT_SCHEDULER, PackingConfig().policy(), gpu_nodes_reserved=True)
    assert open_nodes.choose(st, pod, random.Random(0)) == (0, ())
    assert reserved.choose(st, pod, random.Random(0)) == (1, ())
    # No node without GPUs has room: the pod is unschedulable rather than on a reserved node.
    assert reserved.choose(st, Shape(0, 0.0, cpu_milli=4000), random.Random(0)) is None
    # GPU pods go through tessera-scheduler with the toleration: reserved nodes take them.
    assert reserved.choose(st, Shape.share(1, 500, cpu_milli=1000), random.Random(0)) is not None
