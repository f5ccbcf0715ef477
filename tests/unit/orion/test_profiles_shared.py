"""The extender, the node agent and Orion's policy agree on profiles and on the HP rule: the interference
score's complementarity says "run together" exactly where Listing 1 does, the extender's profile names map
to Orion's profiles, and a pod the extender sees as latency-critical is the agent's HP lane (one per GPU on
both sides)."""

from __future__ import annotations

import itertools
import json

import pytest
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.extender.view import DEFAULT_HP_PRIORITY_CLASSES, PROFILES, pod_spec
from tessera.policy.lanes.placement import (
    PROFILE_FRACTION,
    GpuRequest,
    GpuState,
    PlacementConfig,
    complementarity,
    why_not,
)
from tessera.policy.orion.profiles import Profile, different_profiles
from tessera_agent.lanes.book import LaneAdmissionError, LaneBook, lane_class
from tessera_agent.pods import pod_info_from_manifest


def test_complementarity_agrees_with_listing1_on_every_profile_pair() -> None:
    for a, b in itertools.product(Profile, repeat=2):
        together = complementarity(PROFILE_FRACTION[a], PROFILE_FRACTION[b]) >= 0.5
        assert together == different_profiles(a, b), (a, b)


def test_extender_profile_names_are_orions_profiles() -> None:
    assert {p.name.lower(): PROFILE_FRACTION[p] for p in Profile} == PROFILES


LIMITS = {
    contract.RESOURCE_GPU: "1",
    contract.RESOURCE_GPU_MEMORY: "1000",
    contract.RESOURCE_GPU_COMPUTE: "30",
}


def manifest(name: str, *, workload: str = "", priority_class: str = "") -> dict[str, object]:
    a = Assignment(node="n", gpu_uuids=["GPU-0"], lane_id=name, memory_mib=1000, compute_percent=30)
    ann = {contract.ANN_ASSIGNMENT: a.to_annotation()}
    if workload:
        ann[contract.ANN_WORKLOAD] = workload
    spec: dict[str, object] = {"containers": [{"name": "m", "resources": {"limits": LIMITS}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "annotations": ann},
        "spec": spec,
    }


def extender_says_second_hp_fits(
    m1: dict[str, object], m2: dict[str, object], hp_classes: tuple[str, ...] = DEFAULT_HP_PRIORITY_CLASSES
) -> bool:
    gpu = GpuState(0, "GPU-0", 16000)
    cfg = PlacementConfig()
    for m in (m1, m2):
        spec = pod_spec(json.loads(json.dumps(m)), hp_classes)
        assert spec is not None and spec.problem is None
        req: GpuRequest = spec.resolve(16000)
        if why_not(gpu, req, cfg) is not None:
            return False
        gpu.add(req.as_tenant())
    return True


def agent_says_second_hp_fits(
    m1: dict[str, object], m2: dict[str, object], hp_classes: tuple[str, ...] = DEFAULT_HP_PRIORITY_CLASSES
) -> bool:
    book = LaneBook({"GPU-0": 16000}, hp_priority_classes=hp_classes)
    book.admit(pod_info_from_manifest(m1))
    try:
        book.admit(pod_info_from_manifest(m2))
    except LaneAdmissionError:
        return False
    return True


def test_latency_critical_by_annotation_is_hp_on_both_sides() -> None:
    a, b = (manifest(n, workload="serving:latency-critical") for n in "ab")
    assert lane_class(pod_info_from_manifest(a)) == "HP"
    assert not extender_says_second_hp_fits(a, b) and not agent_says_second_hp_fits(a, b)
    c, d = (manifest(n, workload="training:best-effort") for n in "cd")
    assert extender_says_second_hp_fits(c, d) and agent_says_second_hp_fits(c, d)


def test_latency_critical_by_priority_class_is_hp_on_both_sides() -> None:
    a, b = (manifest(n, workload="serving", priority_class="latency-critical") for n in "ab")
    assert lane_class(pod_info_from_manifest(a)) == "HP"
    assert not extender_says_second_hp_fits(a, b) and not agent_says_second_hp_fits(a, b)


def test_hp_priority_classes_set_on_both_sides_agree() -> None:
    """The chart gives the extender and the agent the same --hp-priority-class list: with `serving-hp`
    in it, two such pods never share a GPU, and `latency-critical` (no longer listed) is best-effort."""
    classes = ("serving-hp",)
    a, b = (manifest(n, workload="serving", priority_class="serving-hp") for n in "ab")
    assert not extender_says_second_hp_fits(a, b, classes) and not agent_says_second_hp_fits(a, b, classes)
    c, d = (manifest(n, workload="serving", priority_class="latency-critical") for n in "cd")
    assert extender_says_second_hp_fits(c, d, classes) and agent_says_second_hp_fits(c, d, classes)
    # the annotation's class wins over the priority class on both sides
    e, f = (manifest(n, workload="serving:best-effort", priority_class="serving-hp") for n in "ef")
    assert extender_says_second_hp_fits(e, f, classes) and agent_says_second_hp_fits(e, f, classes)


def test_extender_flag_reaches_the_view() -> None:
    import argparse

    from tessera.commands import extender as cmd

    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(["extender", "--hp-priority-class", "serving-hp", "--hp-priority-class=x"])
    assert cmd.hp_priority_classes(args) == ("serving-hp", "x")
    assert cmd.hp_priority_classes(parser.parse_args(["extender"])) == DEFAULT_HP_PRIORITY_CLASSES
    with pytest.raises(cmd.PlacementError, match="empty"):
        cmd.hp_priority_classes(parser.parse_args(["extender", "--hp-priority-class", " "]))


def test_extender_parses_pods_with_its_views_priority_classes() -> None:
    from tessera.extender.server import Extender
    from tessera.extender.view import SchedulerCache

    pod = manifest("a", workload="serving", priority_class="serving-hp")
    spec = Extender(None, view=SchedulerCache(("serving-hp",))).spec(pod)
    assert spec is not None and spec.workload_class == "latency-critical"
    spec = Extender(None).spec(pod)
    assert spec is not None and spec.workload_class == "best-effort"
