"""What the extender reads from ResourceClaims (`lanes.api: dra`): a pod's GPUs from its claim's requests of
DeviceClass gpu.tessera.io (odd ones refused with the reason), what allocated claims hold per GPU, and the
priorities a pod asking through a claim then gets (Tessera's rule, as for a device-plugin pod)."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.extender.claims import (
    ClaimReadError,
    ClaimRequest,
    ClaimShare,
    claim_request,
    claim_shares,
    claimed_gpus,
    extended_claim_name,
    pod_claim_names,
)
from tessera.extender.handoff import waiting_node
from tessera.extender.server import Extender
from tessera.extender.view import Holding
from tessera.policy.lanes.fragmentation import Shape
from tessera.policy.lanes.packing import PackingConfig
from tessera.policy.lanes.placement import PlacementConfig, Tenant

CLASS = contract.DRA_DEVICE_CLASS


def claim(*requests: dict[str, Any], name: str = "c", results: list[dict[str, Any]] | None = None) -> Any:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": f"r{i}", **r} for i, r in enumerate(requests)]}},
    }
    if results is not None:
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def lane(memory: str | None = None, compute: str | None = None, **more: Any) -> dict[str, Any]:
    asked = {k: v for k, v in (("memory", memory), ("computeShare", compute)) if v is not None}
    exactly: dict[str, Any] = {"deviceClassName": CLASS, **more}
    if asked:
        exactly["capacity"] = {"requests": asked}
    return {"exactly": exactly}


def result(node: str, device: str, memory: str | None, compute: str | None, **more: Any) -> dict[str, Any]:
    consumed = {k: v for k, v in (("memory", memory), ("computeShare", compute)) if v is not None}
    return {"request": "r0", "driver": contract.DRA_DRIVER, "pool": node, "device": device,
            "consumedCapacity": consumed, **more}  # fmt: skip


def test_a_lane_a_whole_gpu_and_several_gpus_as_the_allocator_charges_them() -> None:
    assert claim_request(claim(lane("10Gi", "30"))) == ClaimRequest(1, 30, 10240)
    assert claim_request(claim(lane())) == ClaimRequest(1, 100, None)  # capacities' defaults: all of it
    assert claim_request(claim(lane("10Gi"))) == ClaimRequest(1, 100, 10240)
    assert claim_request(claim(lane(compute="25"))) == ClaimRequest(1, 25, None)
    assert claim_request(claim(lane("1500Ki", "12.5"))) == ClaimRequest(1, 13, 2)  # rounded up, never down
    assert claim_request(claim(lane("4Gi", "50", count=2))) == ClaimRequest(2, 50, 4096)
    assert claim_request(claim(lane("4Gi", "50"), lane("4Gi", "50"))) == ClaimRequest(2, 50, 4096)


def test_a_claim_of_other_devices_asks_no_gpu() -> None:
    other = {"exactly": {"deviceClassName": "nic.example.com"}}
    assert claim_request(claim(other)) is None
    assert claim_request(claim(other, lane("8Gi", "20"))) == ClaimRequest(1, 20, 8192)
    assert claim_request({"metadata": {}}) is None


@pytest.mark.parametrize(
    ("requests", "why"),
    [
        ([{"firstAvailable": [{"name": "a", "deviceClassName": CLASS}]}], "prioritized list"),
        ([lane("8Gi", "20", selectors=[{"cel": {"expression": "true"}}])], "has selectors"),
        ([lane(allocationMode="All")], "allocationMode All"),
        ([lane(adminAccess=True)], "admin access"),
        ([lane("8Gi", "20"), lane("4Gi", "20")], "different sizes"),
        ([lane("8Gi", "120")], "more than 100 %"),
        ([lane("lots", "20")], "not a quantity"),
        ([lane("0", "20")], "above 0"),
        ([lane(count=0)], "at least 1"),
        ([lane(count="2")], "at least 1"),
        ([{"name": "x"}], "neither exactly nor firstAvailable"),
    ],
)
def test_an_odd_claim_is_refused_with_the_reason(requests: list[dict[str, Any]], why: str) -> None:
    with pytest.raises(ClaimReadError, match=why):
        claim_request(claim(*requests))


def test_the_claims_a_pod_names_directly_or_through_the_controller() -> None:
    pod = {
        "spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "mine"},
                                    {"name": "b", "resourceClaimTemplateName": "lane-30"}]},
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x7k2q"}]},
    }  # fmt: skip
    assert pod_claim_names(pod) == ["mine", "p-b-x7k2q"]
    del pod["status"]
    with pytest.raises(ClaimReadError, match="not made from its template yet"):
        pod_claim_names(pod)


def test_what_an_allocated_claim_holds() -> None:
    c = claim(lane("10Gi", "30"), results=[
        result("n1", "gpu-1", "10Gi", "30"),
        result("n1", "gpu-0", None, None),  # no consumed capacity: the whole GPU
        result("n1", "gpu-2", "10Gi", "30", adminAccess=True),  # an observer holds nothing
        {**result("n1", "nic-0", None, None), "driver": "nic.example.com"},
    ])  # fmt: skip
    assert claim_shares(c) == [ClaimShare("n1", 1, 10240, 30), ClaimShare("n1", 0, None, 100)]
    assert claim_shares(claim(lane())) == []  # not allocated
    with pytest.raises(ClaimReadError, match="not one the agent publishes"):
        claim_shares(claim(lane(), results=[result("n1", "lane-3", None, None)]))


def gpu_node(name: str, gpus: int, cpu: str = "64") -> dict[str, Any]:
    inv = [GpuInfo(uuid=f"{name}-{i}", index=i, model="A100", memory_mib=40960) for i in range(gpus)]
    return {
        "metadata": {"name": name, "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)}},
        "status": {"allocatable": {"cpu": cpu, "memory": "256Gi"}},
    }


def claim_pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "resourceClaims": [{"name": "lane", "resourceClaimTemplateName": "lane-30"}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                       "claims": [{"name": "lane"}]}}],
        },
        "status": {"phase": "Pending", "resourceClaimStatuses": [{"name": "lane", "resourceClaimName": claim_name}]},
    }  # fmt: skip


def extender() -> Extender:
    ext = Extender(None, config=PlacementConfig(packing=True), claims=True)
    ext.packing = PackingConfig(prior=((Shape(1, 1.0, 0.0, 1.0), 100.0),))  # the workload: whole GPUs
    ext.view.distribution = ext.packing.distribution()
    for n in (gpu_node("a", 2), gpu_node("b", 2)):
        ext.view.apply_node(n)
    return ext


def scores(ext: Extender, pod: dict[str, Any]) -> dict[str, int]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["a", "b"]}
    assert ext.filter(body)["NodeNames"] == ["a", "b"]  # the allocator, not the extender, fits devices
    return {h["Host"]: h["Score"] for h in ext.prioritize(body)}


def test_a_pod_asking_through_a_claim_is_scored_by_the_rule_against_what_claims_hold() -> None:
    ext = extender()
    # 70 % of a's gpu-0 is held by another claim: a 30 % lane fills it, leaving a's gpu-1 and b whole
    ext.view.apply_claim(claim(lane("28Gi", "70"), name="held", results=[result("a", "gpu-0", "28Gi", "70")]))
    ext.view.apply_claim(claim(lane("10Gi", "30"), name="p-lane-1"))
    got = scores(ext, claim_pod("p", "p-lane-1"))
    assert got["a"] > got["b"], got
    # that claim gone (its pod ended) and another holding b's gpu-1 the same way: b is now the one to fill
    ext.view.delete_claim({"metadata": {"name": "held", "namespace": "ml"}})
    ext.view.apply_claim(
        claim(lane("28Gi", "70"), name="other", results=[result("b", "gpu-1", "28Gi", "70")])
    )
    got = scores(ext, claim_pod("p", "p-lane-1"))
    assert got["b"] > got["a"], got


def test_a_claim_not_read_or_odd_gives_every_node_the_same_priority() -> None:
    ext = extender()
    ext.view.apply_claim(claim(lane("28Gi", "70"), name="held", results=[result("a", "gpu-0", "28Gi", "70")]))
    assert set(scores(ext, claim_pod("p", "not-seen")).values()) == {0}
    ext.view.apply_claim(claim(lane("8Gi", "20"), lane("4Gi", "20"), name="odd"))
    assert set(scores(ext, claim_pod("q", "odd")).values()) == {0}


def test_claims_leave_device_plugin_pods_and_relists_alone() -> None:
    ext = extender()
    ext.view.apply_claim(claim(lane("28Gi", "70"), name="held", results=[result("a", "gpu-0", "28Gi", "70")]))
    mark = ext.view.mark()
    ext.view.replace_pods([], mark)  # a pod relist keeps what claims hold
    assert ext.view.nodes["a"][0].used_compute == 70
    ext.view.replace_claims([])  # a claim relist drops what is gone
    assert ext.view.nodes["a"][0].used_compute == 0
    assert ext.view.claims == {}


def test_a_pod_asking_tessera_gpu_is_counted_once_by_its_assignment_not_also_by_its_claim() -> None:
    """A pod asking `tessera.io/gpu` on DRA lanes gets a claim kube-scheduler makes (KEP-5004) and, bound by the
    extender, an assignment: the view counts its GPU once, whichever of the two it sees first."""
    made = claim(lane(), name="p-extended-resources-x", results=[result("a", "gpu-1", "40Gi", "100")])
    made["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    made["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "uid-p"}]
    for claim_first in (True, False):
        ext = extender()
        if claim_first:
            ext.view.apply_claim(made)
            assert ext.view.nodes["a"][1].used_compute == 100
        ext.view.hold("uid-p", Holding("a", (1,), "g1-l1", Tenant(40960, 100)))
        ext.view.apply_claim(made)
        assert ext.view.nodes["a"][1].used_compute == 100, claim_first


def test_without_dra_claims_a_claim_pod_is_scored_as_before_by_its_cpu_and_memory() -> None:
    """The device plugin's path (no --dra-claims): claims are not read, and a pod with one is ranked as a pod
    asking no GPU (nodes without GPUs first), as before."""
    ext = Extender(None, config=PlacementConfig(packing=True))
    for n in (gpu_node("a", 2), gpu_node("plain", 0)):
        ext.view.apply_node(n)
    body = {"Pod": claim_pod("p", "p-lane-1"), "Nodes": None, "NodeNames": ["a", "plain"]}
    got = {h["Host"]: h["Score"] for h in ext.prioritize(body)}
    assert got["plain"] == 10 and got["a"] < 10, got


def extended_claim(*results: dict[str, Any], reserved_for: str = "uid-p") -> Any:
    """The claim kube-scheduler makes for a pod's tessera.io/gpu, as its PreBind leaves it."""
    made = claim(lane(), name="p-extended-resources-x", results=list(results))
    made["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    made["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": reserved_for}]
    return made


def test_the_claim_made_for_a_pods_tessera_gpu_is_read_from_its_status() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"phase": "Pending"}}
    with pytest.raises(ClaimReadError, match="no claim for its tessera"):
        extended_claim_name(pod)  # PreBind has not recorded it (yet)
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "p-extended-resources-x",
        "requestMappings": [{"containerName": "c", "resourceName": "tessera.io/gpu", "requestName": "r0"}],
    }
    assert extended_claim_name(pod) == "p-extended-resources-x"


def test_the_gpus_of_an_allocated_extended_resource_claim() -> None:
    whole = "40448Mi"
    one = extended_claim(result("a", "gpu-1", whole, "100"))
    assert claimed_gpus(one, "uid-p", "a") == [1]
    # count 2: two whole GPUs, in the allocator's order
    two = extended_claim(result("a", "gpu-3", whole, "100"), result("a", "gpu-2", whole, "100"))
    assert claimed_gpus(two, "uid-p", "a") == [3, 2]
    # another driver's devices in the same claim (another extended resource) are not this pod's GPUs
    nic = {**result("a", "nic-0", None, None), "driver": "nic.example.com"}
    assert claimed_gpus(extended_claim(nic, result("a", "gpu-0", whole, "100")), "uid-p", "a") == [0]
    assert claimed_gpus(extended_claim(result("a", "gpu-0", None, None)), "uid-p", "a") == [0]  # no capacity


@pytest.mark.parametrize(
    ("made", "why"),
    [
        ({**extended_claim(), "status": {}}, "not allocated yet"),
        (
            extended_claim(result("a", "gpu-1", "40448Mi", "100"), reserved_for="uid-q"),
            "not reserved for the pod",
        ),
        (extended_claim({**result("a", "nic-0", None, None), "driver": "nic.example.com"}), "no device of"),
        (extended_claim(result("b", "gpu-1", "40448Mi", "100")), "of node 'b', not of a"),
        (extended_claim(result("a", "gpu-1", "10Gi", "30")), "a share of gpu-1"),
        (
            extended_claim(result("a", "gpu-1", "20Gi", "50"), result("a", "gpu-1", "20Gi", "50")),
            "share of gpu-1",
        ),
        (extended_claim(result("a", "lane-1", None, None)), "not one the agent publishes"),
        (claim(lane(), results=[result("a", "gpu-1", "40448Mi", "100")]), "not one kube-scheduler made"),
    ],
)
def test_an_extended_resource_claim_that_names_no_whole_gpus_of_the_node_is_refused(
    made: Any, why: str
) -> None:
    with pytest.raises(ClaimReadError, match=why):
        claimed_gpus(made, "uid-p", "a")
    deleting = extended_claim(result("a", "gpu-1", "40448Mi", "100"))
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    with pytest.raises(ClaimReadError, match="being deleted"):
        claimed_gpus(deleting, "uid-p", "a")


def test_a_pod_served_by_its_claim_waits_for_no_allocate() -> None:
    """The handoff holds a node for a bound pod until the agent's Allocate marks it; a pod whose tessera.io/gpu
    a claim serves (DRA lanes) never gets an Allocate, so it holds no node."""
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "uid": "uid-p", "annotations": {contract.ANN_ASSIGNMENT: "{}"}},
        "spec": {"nodeName": "a"},
        "status": {"phase": "Pending"},
    }
    assert waiting_node(pod) == "a"
    pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended-resources-x"}
    assert waiting_node(pod) is None
