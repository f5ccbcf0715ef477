"""Packing through DRA (docs/dra.md, "Packing through DRA"): a pod asking for a lane through a
ResourceClaimTemplate, placed by the real tessera-scheduler (kube-scheduler v1.37 with the shipped
configuration) and `tessera extender --dra-claims`, on the node Tessera's rule prefers, where the default
scheduler's scores put the same pod on another node. The claim is made by the real resource claim controller
and allocated by the real DynamicResources plugin, from slices shaped as the agent publishes them."""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from tessera.api import contract
from tessera_agent.gpus.backend import usable_memory_mib
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_slice import device_class, resource_slice

from .conftest import Credentials, Nodes, Scheduling, run_scheduling
from .controlplane import ControlPlane, default_scheduler, wait_until

RESOURCE_API = "/apis/resource.k8s.io/v1"
GPUS = FakeGpuBackend.uniform(2)


@pytest.fixture
def two_nodes(cluster: ControlPlane, nodes: Nodes) -> Iterator[tuple[str, str]]:
    """Two nodes of two fake 40 GiB GPUs each: the agent's inventory annotation (what the extender reads) and
    the slice its DRA driver publishes (what the allocator reads). The slices are removed afterwards."""
    usable = usable_memory_mib(GPUS.gpus()[0])
    made = []
    for side in ("a", "b"):
        name = nodes.add(f"pack-{side}-{secrets.token_hex(3)}", gpus=2, memory_mib=usable, model="A100")
        status, body = cluster.request(
            "POST", f"{RESOURCE_API}/resourceslices", resource_slice(name, GPUS, slots=4, generation=0)
        )
        assert status == 201, body
        made.append(name)
    status, body = cluster.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    assert status in (201, 409), body
    yield made[0], made[1]
    for name in made:
        cluster.request("DELETE", f"{RESOURCE_API}/resourceslices/{name}-{contract.DRA_DRIVER}")


@pytest.fixture
def tessera_scheduler(cluster: ControlPlane, chart_rbac: dict[str, Credentials]) -> Iterator[Scheduling]:
    """tessera-scheduler and its extender as the chart runs them with `lanes.api: dra` (no kubelet here to
    call Allocate, so no handoff), under the chart's `scheduler` ServiceAccount."""
    args = ("--no-allocate-handoff", "--dra-claims")
    with run_scheduling(cluster, chart_rbac["scheduler"], args) as started:
        yield started


def lane_template(namespace: str, name: str, memory: str, compute: str, select: str | None = None) -> Any:
    exactly: dict[str, Any] = {
        "deviceClassName": contract.DRA_DEVICE_CLASS,
        "capacity": {"requests": {"memory": memory, "computeShare": compute}},
    }
    if select:
        exactly["selectors"] = [{"cel": {"expression": select}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def lane_pod(name: str, template: str, cpu: str, scheduler: str | None, node: str | None = None) -> Any:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "lane", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "trainer:1",
                        "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "claims": [{"name": "lane"}]}}],
    }  # fmt: skip
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(cluster: ControlPlane, path: str, body: Any) -> None:
    status, out = cluster.request("POST", path, body)
    assert status == 201, out


def placed(cluster: ControlPlane, namespace: str, pod: str) -> tuple[str, list[tuple[str, str]]] | None:
    """The pod's node and its claim's devices as (pool, device) once it is bound with the claim allocated."""
    got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod}") or {}
    node = (got.get("spec") or {}).get("nodeName")
    statuses = (got.get("status") or {}).get("resourceClaimStatuses") or []
    if not node or not statuses:
        return None
    claim = cluster.get(
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    return (node, [(r["pool"], r["device"]) for r in results]) if results else None


def priorities(url: str, pod: Any, nodes: list[str]) -> dict[str, int]:
    """The extender's answer to kube-scheduler's prioritize call for `pod` over `nodes`."""
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": nodes}).encode()
    req = urllib.request.Request(f"{url}/prioritize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {h["Host"]: h["Score"] for h in json.loads(resp.read())}


def test_a_lane_claim_goes_where_the_rule_packs_it_not_where_default_scores_spread_it(
    cluster: ControlPlane, two_nodes: tuple[str, str], namespace: str, tessera_scheduler: Scheduling
) -> None:
    """b's gpu-0 is 70 % held, by a pod that also takes 16 of b's 64 cores. A 30 % lane fills that GPU: Tessera's
    rule sends it to b: the extender ranks b above a for it (an extender blind to claims sees every GPU idle
    and ranks them alike). The default scheduler's scores (CPU and memory left) send the same pod to a."""
    a, b = two_nodes
    sched = tessera_scheduler.scheduler
    templates = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    attrs = f'device.attributes["{contract.DRA_DRIVER}"]'
    create(cluster, templates, lane_template(namespace, "held", "28Gi", "70", select=f"{attrs}.index == 0"))
    create(cluster, pods, lane_pod("holder", "held", "16", contract.SCHEDULER_NAME, node=b))
    holder = wait_until(lambda: placed(cluster, namespace, "holder"), 120, "the holder placed", sched)
    assert holder == (b, [(b, "gpu-0")])

    create(cluster, templates, lane_template(namespace, "lane-30", "10Gi", "30"))
    gated = lane_pod("packed", "lane-30", "1", contract.SCHEDULER_NAME)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]  # held back until the ranking is read
    create(cluster, pods, gated)
    pod = wait_until(
        lambda: (
            (p := cluster.get(f"{pods}/packed"))
            and (p.get("status") or {}).get("resourceClaimStatuses")
            and p
        ),
        120,
        "the lane's claim made from its template",
    )
    ranked = priorities(tessera_scheduler.extender_url, pod, [a, b])
    assert ranked[b] > ranked[a], ranked
    status, out = cluster.request(
        "PATCH",
        f"{pods}/packed",
        {"spec": {"schedulingGates": None}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, out
    packed = wait_until(lambda: placed(cluster, namespace, "packed"), 120, "the lane placed", sched)
    # the rule fills b's gpu-0, and the allocator's first device that fits on b is that very GPU
    assert packed == (b, [(b, "gpu-0")]), packed

    # The same pod under the default scheduler: spread by CPU and memory, to a
    with default_scheduler(cluster) as default:
        create(cluster, pods, lane_pod("spread", "lane-30", "1", None))
        spread = wait_until(lambda: placed(cluster, namespace, "spread"), 120, "the default's lane", default)
    assert spread == (a, [(a, "gpu-0")]), spread
