"""DRA claims that keep their GPUs under one PCIe root, allocated by the real kube-scheduler from the slice
the node agent publishes (`dra_slice.resource_slice`: pcieRoot and numaNode from the GPUs' PCI addresses)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from tessera.api import contract
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_slice import device_class, resource_slice

from .conftest import Nodes
from .controlplane import ControlPlane, Process, default_scheduler, wait_until

RESOURCE_API = "/apis/resource.k8s.io/v1"
ROOT_ATTRIBUTE = f"{contract.DRA_DRIVER}/{contract.DRA_ATTRIBUTE_PCIE_ROOT}"


@pytest.fixture
def scheduler(cluster: ControlPlane) -> Iterator[Process]:
    with default_scheduler(cluster) as proc:
        yield proc


def whole_gpus(
    name: str, requests: list[str], *, one_root: bool, select: str | None = None
) -> dict[str, Any]:
    """A claim of one whole GPU per request (no capacity named: the defaults, all of it), its requests kept
    under one root complex when `one_root`; `select` a CEL expression each device must also match."""
    exactly: dict[str, Any] = {"deviceClassName": contract.DRA_DEVICE_CLASS}
    if select:
        exactly["selectors"] = [{"cel": {"expression": select}}]
    devices: dict[str, Any] = {"requests": [{"name": r, "exactly": exactly} for r in requests]}
    if one_root:
        devices["constraints"] = [{"requests": requests, "matchAttribute": ROOT_ATTRIBUTE}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}  # fmt: skip


def claim_pod(name: str, claim: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "containers": [{"name": "main", "image": "trainer:1", "resources": {"claims": [{"name": "gpus"}]}}],
        },
    }  # fmt: skip


def submit(cluster: ControlPlane, namespace: str, claim: dict[str, Any], pod: str, node: str) -> None:
    status, body = cluster.request("POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims", claim)
    assert status == 201, body
    name = claim["metadata"]["name"]
    status, body = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", claim_pod(pod, name, node))
    assert status == 201, body


def allocated(cluster: ControlPlane, namespace: str, claim: str) -> list[str]:
    """The devices the scheduler allocated to the claim, in request order; [] while it has none."""
    got = cluster.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{claim}") or {}
    results = ((got.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return [r["device"] for r in results]


def unschedulable(cluster: ControlPlane, namespace: str, pod: str) -> str:
    got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod}") or {}
    for cond in (got.get("status") or {}).get("conditions") or []:
        if (
            cond["type"] == "PodScheduled"
            and cond["status"] == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return str(cond.get("message", ""))
    return ""


@pytest.fixture
def four_gpus(cluster: ControlPlane, nodes: Nodes) -> Iterator[str]:
    """A node whose agent publishes four GPUs, two per root: gpu-0 and gpu-1 under pci0000:00, gpu-2 and gpu-3
    under pci0000:40 (`FakeGpuBackend.uniform`'s bus IDs); its name. The slice is removed afterwards."""
    node = nodes.add(f"topo-{secrets.token_hex(3)}", gpus=4)
    gpus = FakeGpuBackend.uniform(4, gpus_per_root=2)
    status, body = cluster.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    assert status in (201, 409), body
    status, body = cluster.request(
        "POST", f"{RESOURCE_API}/resourceslices", resource_slice(node, gpus, slots=4, generation=0)
    )
    assert status == 201, body
    yield node
    cluster.request("DELETE", f"{RESOURCE_API}/resourceslices/{node}-{contract.DRA_DRIVER}")


def hold_gpu_1(cluster: ControlPlane, namespace: str, node: str, scheduler: Process) -> None:
    """gpu-1 taken whole: the first two GPUs that fit are then gpu-0 and gpu-2, under different roots."""
    attrs = f'device.attributes["{contract.DRA_DRIVER}"]'
    holder = whole_gpus("holder", ["gpu"], one_root=False, select=f"{attrs}.index == 1")
    submit(cluster, namespace, holder, "holder", node)
    wait_until(lambda: allocated(cluster, namespace, "holder"), 90, "the holder's GPU", scheduler)
    assert allocated(cluster, namespace, "holder") == ["gpu-1"]


def test_a_claim_over_two_gpus_of_one_root_gets_them_and_one_that_cannot_waits(
    cluster: ControlPlane, four_gpus: str, namespace: str, scheduler: Process
) -> None:
    node = four_gpus
    published = cluster.get(f"{RESOURCE_API}/resourceslices/{node}-{contract.DRA_DRIVER}")["spec"]["devices"]
    attributes = {d["name"]: d["attributes"] for d in published}
    assert {n: a[contract.DRA_ATTRIBUTE_PCIE_ROOT]["string"] for n, a in attributes.items()} == {
        "gpu-0": "pci0000:00", "gpu-1": "pci0000:00", "gpu-2": "pci0000:40", "gpu-3": "pci0000:40"
    }  # fmt: skip
    assert attributes["gpu-3"][contract.DRA_ATTRIBUTE_NUMA_NODE] == {"int": 1}
    hold_gpu_1(cluster, namespace, node, scheduler)

    submit(cluster, namespace, whole_gpus("pair", ["a", "b"], one_root=True), "pair", node)
    pair = wait_until(lambda: allocated(cluster, namespace, "pair"), 90, "the pair's GPUs", scheduler)
    assert sorted(pair) == ["gpu-2", "gpu-3"]  # the one root with two free GPUs

    # left: gpu-0 alone under its root; two whole GPUs of one root fit nowhere, and the claim stays so
    submit(cluster, namespace, whole_gpus("second-pair", ["a", "b"], one_root=True), "second-pair", node)
    reason = wait_until(
        lambda: unschedulable(cluster, namespace, "second-pair"), 90, "the second pair refused", scheduler
    )
    assert "cannot allocate all claims" in reason, reason
    assert allocated(cluster, namespace, "second-pair") == []


def test_without_the_constraint_the_allocator_takes_the_first_gpus_across_roots(
    cluster: ControlPlane, four_gpus: str, namespace: str, scheduler: Process
) -> None:
    """The same pair with no constraint: what the constraint above changed."""
    hold_gpu_1(cluster, namespace, four_gpus, scheduler)
    submit(cluster, namespace, whole_gpus("pair", ["a", "b"], one_root=False), "pair", four_gpus)
    pair = wait_until(lambda: allocated(cluster, namespace, "pair"), 90, "the pair's GPUs", scheduler)
    assert sorted(pair) == ["gpu-0", "gpu-2"]
