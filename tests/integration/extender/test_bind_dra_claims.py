"""/bind of a pod asking `tessera.io/gpu` on a node with DRA lanes (`--dra-claims`, the node advertising no
tessera.io/gpu): the assignment names the GPUs of the claim kube-scheduler made and allocated for it
(KEP-5004), read from the API server at bind, even when the view already counts that claim; a claim not
recorded, not allocated or not reserved for the pod fails the bind with the reason, writing nothing. A node
whose allocatable lists tessera.io/gpu keeps the device plugin's bind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.extender.server import Extender
from tessera.kube import KubeClient, KubeConfig

from .conftest import node, pod
from .fake_apiserver import FakeApiServer

CLAIM = "p-extended-resources-x"
ARGS = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "a"}


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeApiServer, Extender]]:
    """The fake API server and an extender reading claims, its view filled by the test (node a: 3 GPUs)."""
    api = FakeApiServer()
    server = TestServer(api.app())
    await server.start_server()
    kube = KubeClient(KubeConfig(str(server.make_url("")).rstrip("/")))
    ext = Extender(kube, claims=True)
    try:
        yield api, ext
    finally:
        await kube.close()
        await server.close()


def whole(device: str) -> dict[str, Any]:
    return {"request": "container-0-request-0", "driver": contract.DRA_DRIVER, "pool": "a", "device": device,
            "consumedCapacity": {"memory": "16000Mi", "computeShare": "100", "clients": "1"}}  # fmt: skip


def made_claim(*results: dict[str, Any], allocated: bool = True) -> dict[str, Any]:
    """The claim kube-scheduler's PreBind made, allocated and reserved for pod p."""
    out: dict[str, Any] = {
        "metadata": {"name": CLAIM, "namespace": "default", "uid": "uid-claim",
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": contract.DRA_DEVICE_CLASS, "allocationMode": "ExactCount", "count": len(results)}}]}},
    }  # fmt: skip
    if allocated:
        out["status"] = {
            "allocation": {"devices": {"results": list(results)}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-p"}],
        }
    return out


def setup(api: FakeApiServer, ext: Extender, gpus: int = 1, recorded: bool = True) -> None:
    """Node a (3 GPUs, no tessera.io/gpu advertised), gpu-0 30 % held by another claim, and pod p asking
    tessera.io/gpu: `gpus`, bound by kube-scheduler's PreBind to its claim when `recorded`."""
    n = node("a", gpus=3)
    n["status"] = {"allocatable": {"cpu": "64", "memory": "256Gi"}}
    ext.view.apply_node(n)
    other = made_claim({**whole("gpu-0"), "consumedCapacity": {"memory": "4Gi", "computeShare": "30"}})
    other["metadata"] = {"name": "lane", "namespace": "default", "uid": "uid-lane"}
    other["status"]["reservedFor"] = [{"resource": "pods", "name": "q", "uid": "uid-q"}]
    ext.view.apply_claim(other)
    p = pod("p", memory=None, compute=None, gpus=gpus)
    if recorded:
        p["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": CLAIM, "requestMappings": [
            {"containerName": "c", "resourceName": contract.RESOURCE_GPU, "requestName": "container-0-request-0"}]}  # fmt: skip
    api.put_pod(p)
    ext.view.apply_pod(p)


def claim_unread(ext: Extender) -> float:
    value = ext.metrics.registry.get_sample_value(
        "tessera_extender_binds_total", {"outcome": "error", "reason": "claim_unread"}
    )
    return value or 0.0


async def test_the_assignment_names_the_claims_gpu_even_when_the_view_counts_that_claim(
    served: tuple[FakeApiServer, Extender],
) -> None:
    """The claim (gpu-1) reached the view before the bind, as it often does: the view counts gpu-1 as held,
    and GPUs chosen by the extender's own rule would have been gpu-2. The bind names gpu-1, and the view then
    counts it once, by the assignment."""
    api, ext = served
    setup(api, ext)
    api.claims[f"default/{CLAIM}"] = made_claim(whole("gpu-1"))
    ext.view.apply_claim(api.claims[f"default/{CLAIM}"])
    assert ext.view.nodes["a"][1].used_compute == 100
    assert await ext.bind(ARGS) == {"Error": ""}
    stored = api.pods["default/p"]
    a = Assignment.parse(stored["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert (a.node, a.gpu_indices, a.gpu_uuids) == ("a", [1], ["GPU-a-1"])
    assert (a.memory_mib, a.compute_percent) == (16000, 100)
    assert stored["spec"]["nodeName"] == "a"
    assert [g.used_compute for g in ext.view.nodes["a"]] == [30, 100, 0]


async def test_two_gpus_are_the_claims_two_in_its_order(served: tuple[FakeApiServer, Extender]) -> None:
    api, ext = served
    setup(api, ext, gpus=2)
    api.claims[f"default/{CLAIM}"] = made_claim(whole("gpu-2"), whole("gpu-1"))
    assert await ext.bind(ARGS) == {"Error": ""}
    a = Assignment.parse(api.pods["default/p"]["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert a.gpu_indices == [2, 1] and a.gpu_uuids == ["GPU-a-2", "GPU-a-1"]


@pytest.mark.parametrize(
    ("recorded", "claim", "why"),
    [
        (False, None, "no claim for its tessera.io/gpu is recorded in its status yet"),
        (True, None, "cannot read it: "),
        (True, made_claim(whole("gpu-1"), allocated=False), f"claim default/{CLAIM} is not allocated yet"),
        (True, made_claim(whole("gpu-1"), whole("gpu-2")), "it holds 2 GPUs, the pod asks for 1"),
        (True, made_claim(whole("gpu-7")), f"it holds gpu-7, which {contract.ANN_NODE_GPUS} does not list"),
    ],
)
async def test_a_claim_not_known_at_bind_fails_the_bind_with_the_reason_writing_nothing(
    served: tuple[FakeApiServer, Extender], recorded: bool, claim: dict[str, Any] | None, why: str
) -> None:
    api, ext = served
    setup(api, ext, recorded=recorded)
    if claim is not None:
        api.claims[f"default/{CLAIM}"] = claim
    out = await ext.bind(ARGS)
    assert out["Error"].startswith("cannot bind default/p to a: the GPUs of its claim are not known: ")
    assert why in out["Error"], out
    assert claim_unread(ext) == 1
    stored = api.pods["default/p"]
    assert contract.ANN_ASSIGNMENT not in stored["metadata"]["annotations"]
    assert not stored["spec"].get("nodeName") and api.bindings == []
    assert "uid-p" not in ext.view.holdings


async def test_a_node_where_a_device_plugin_once_advertised_tessera_gpu_binds_from_the_claim(
    served: tuple[FakeApiServer, Extender],
) -> None:
    """The kubelet keeps an extended resource at 0 after its device plugin goes (the node served lanes through
    the device plugin before its agent moved to DRA); kube-scheduler then serves the pod through DRA
    (allocatable 0), and so must the bind: it names the claim's GPU, not one of its own choosing."""
    api, ext = served
    setup(api, ext)
    n = node("a", gpus=3)
    n["status"] = {"allocatable": {"cpu": "64", "memory": "256Gi", contract.RESOURCE_GPU: "0"}}
    ext.view.apply_node(n)
    api.claims[f"default/{CLAIM}"] = made_claim(whole("gpu-2"))
    assert await ext.bind(ARGS) == {"Error": ""}
    a = Assignment.parse(api.pods["default/p"]["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert a.gpu_indices == [2]  # the claim's, where the rule alone would take gpu-1


async def test_a_node_advertising_tessera_gpu_keeps_the_device_plugins_bind(
    served: tuple[FakeApiServer, Extender],
) -> None:
    """kube-scheduler makes no claim where a device plugin advertises the resource: the extender chooses."""
    api, ext = served
    setup(api, ext, recorded=False)
    n = node("a", gpus=3)
    n["status"] = {"allocatable": {"cpu": "64", "memory": "256Gi", contract.RESOURCE_GPU: "3"}}
    ext.view.apply_node(n)
    assert await ext.bind(ARGS) == {"Error": ""}
    a = Assignment.parse(api.pods["default/p"]["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert a.gpu_indices == [1]  # the rule's choice: the first whole GPU
