"""An unhealthy GPU as a device taint (KEP-5055) on the real control plane: the agent's slice publisher
(`dra_plugin.SlicePublisher`, its fake GPUs given a critical XID) against the API server, the real
kube-scheduler allocating claims, and kube-controller-manager's device taint eviction controller."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from tessera.api import contract
from tessera.kube import KubeClient, KubeConfig
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_plugin import KubernetesDraApi, SlicePublisher
from tessera_agent.kubelet.dra_slice import device_class, slice_name

from .conftest import Nodes
from .controlplane import ControlPlane, Process, default_scheduler, wait_until
from .test_dra_topology import allocated, submit, unschedulable, whole_gpus

RESOURCE_API = "/apis/resource.k8s.io/v1"


@pytest.fixture
def scheduler(cluster: ControlPlane) -> Iterator[Process]:
    with default_scheduler(cluster) as proc:
        yield proc


@pytest.fixture
def node(cluster: ControlPlane, nodes: Nodes) -> Iterator[str]:
    """A node of two GPUs and the chart's DeviceClass; its slice is removed afterwards."""
    name = nodes.add(f"health-{secrets.token_hex(3)}", gpus=2)
    status, body = cluster.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    assert status in (201, 409), body
    yield name
    cluster.request("DELETE", f"{RESOURCE_API}/resourceslices/{slice_name(name)}")


def agent_config(node: str, tmp_path: Path, effect: str = "NoSchedule") -> AgentConfig:
    return AgentConfig.model_validate(
        {"node_name": node, "slots_per_gpu": 4, "mps_root": tmp_path / "mps", "dra_unhealthy_effect": effect}
    )


def publisher_of(cfg: AgentConfig, backend: FakeGpuBackend, **kw: Any) -> SlicePublisher:
    """The agent's publisher; its API client is made by each `publish`, in that call's event loop."""
    return SlicePublisher(cfg, backend, KubernetesDraApi(cast(KubeClient, None)), **kw)


def publish(cluster: ControlPlane, publisher: SlicePublisher) -> dict[str, Any]:
    """One publish, as the agent's loop does it, with a client of this call's event loop."""

    async def once() -> dict[str, Any]:
        client = KubeClient(KubeConfig.from_kubeconfig(cluster.kubeconfig))
        try:
            publisher.api = KubernetesDraApi(client)
            return await publisher.publish()
        finally:
            await client.close()

    return asyncio.run(once())


def fault(cluster: ControlPlane, publisher: SlicePublisher, backend: FakeGpuBackend, index: int) -> None:
    """A critical XID on GPU `index`, delivered to the publisher as the agent's health watch does."""
    uuid = backend.gpus()[index].uuid
    backend.inject_fault(uuid)
    event = backend.wait_health_event(5.0)
    assert event is not None and event.uuid == uuid
    assert publisher.set_health(event.uuid, event.healthy)
    publish(cluster, publisher)


def taints(cluster: ControlPlane, node: str) -> dict[str, list[dict[str, Any]]]:
    got = cluster.get(f"{RESOURCE_API}/resourceslices/{slice_name(node)}")
    return {d["name"]: d.get("taints") or [] for d in got["spec"]["devices"]}


def generation(cluster: ControlPlane, node: str) -> int:
    got = cluster.get(f"{RESOURCE_API}/resourceslices/{slice_name(node)}")
    return int(got["spec"]["pool"]["generation"])


def test_a_tainted_gpu_gets_no_new_claim_and_keeps_its_taint_over_a_restart_not_a_reboot(
    cluster: ControlPlane, node: str, namespace: str, scheduler: Process, tmp_path: Path
) -> None:
    backend = FakeGpuBackend.uniform(2)
    cfg = agent_config(node, tmp_path)
    publisher = publisher_of(cfg, backend)
    publish(cluster, publisher)
    assert taints(cluster, node) == {"gpu-0": [], "gpu-1": []}

    fault(cluster, publisher, backend, 0)
    tainted = taints(cluster, node)["gpu-0"]
    assert [(t["key"], t["effect"]) for t in tainted] == [(contract.DRA_TAINT_UNHEALTHY, "NoSchedule")]
    added = tainted[0]["timeAdded"]  # set by the API server
    before = generation(cluster, node)
    publish(cluster, publisher)  # nothing changed: the taint keeps its time, the pool its generation
    assert generation(cluster, node) == before

    # Two claims of a whole GPU each: the first gets gpu-1, the second has only the tainted gpu-0 left.
    submit(cluster, namespace, whole_gpus("first", ["gpu"], one_root=False), "first", node)
    wait_until(lambda: allocated(cluster, namespace, "first"), 90, "the first claim's GPU", scheduler)
    assert allocated(cluster, namespace, "first") == ["gpu-1"]
    submit(cluster, namespace, whole_gpus("second", ["gpu"], one_root=False), "second", node)
    reason = wait_until(
        lambda: unschedulable(cluster, namespace, "second"), 90, "the second refused", scheduler
    )
    assert "cannot allocate all claims" in reason, reason

    # The agent restarts: NVML says nothing of the XID again (a fresh backend, all healthy), the slice does.
    restarted = publisher_of(cfg, FakeGpuBackend.uniform(2))
    publish(cluster, restarted)
    assert taints(cluster, node)["gpu-0"] == tainted
    assert generation(cluster, node) == before
    assert allocated(cluster, namespace, "second") == []

    # A node booted after the taint was added has reset its GPUs: its agent drops the taint, and the second
    # claim gets the GPU.
    rebooted = publisher_of(
        cfg, FakeGpuBackend.uniform(2), boot_time=datetime.fromisoformat(added) + timedelta(seconds=1)
    )
    publish(cluster, rebooted)
    assert taints(cluster, node)["gpu-0"] == []
    wait_until(lambda: allocated(cluster, namespace, "second"), 90, "the second claim's GPU", scheduler)
    assert allocated(cluster, namespace, "second") == ["gpu-0"]


def test_a_taint_removed_by_hand_stays_removed_and_frees_the_gpu(
    cluster: ControlPlane, node: str, namespace: str, scheduler: Process, tmp_path: Path
) -> None:
    """NVML reports no recovery: a person removes the taint (a GPU reset), and the running agent follows."""
    backend = FakeGpuBackend.uniform(2)
    publisher = publisher_of(agent_config(node, tmp_path), backend)
    publish(cluster, publisher)
    fault(cluster, publisher, backend, 0)
    fault(cluster, publisher, backend, 1)
    submit(cluster, namespace, whole_gpus("waits", ["gpu"], one_root=False), "waits", node)
    wait_until(lambda: unschedulable(cluster, namespace, "waits"), 90, "the claim refused", scheduler)

    path = f"{RESOURCE_API}/resourceslices/{slice_name(node)}"
    edited = cluster.get(path)
    del edited["spec"]["devices"][1]["taints"]  # kubectl edit
    status, body = cluster.request("PUT", path, edited)
    assert status == 200, body
    publish(cluster, publisher)  # the agent's next resync
    assert publisher.health[backend.gpus()[1].uuid]
    assert taints(cluster, node)["gpu-1"] == []
    assert [t["key"] for t in taints(cluster, node)["gpu-0"]] == [contract.DRA_TAINT_UNHEALTHY]
    wait_until(lambda: allocated(cluster, namespace, "waits"), 90, "the claim's GPU", scheduler)
    assert allocated(cluster, namespace, "waits") == ["gpu-1"]


def test_no_execute_evicts_the_pod_of_a_claim_on_the_gpu(
    cluster: ControlPlane, node: str, namespace: str, scheduler: Process, tmp_path: Path
) -> None:
    backend = FakeGpuBackend.uniform(2)
    publisher = publisher_of(agent_config(node, tmp_path, "NoExecute"), backend)
    publish(cluster, publisher)
    attrs = f'device.attributes["{contract.DRA_DRIVER}"]'
    for name, index in (("on-0", 0), ("on-1", 1)):
        claim = whole_gpus(name, ["gpu"], one_root=False, select=f"{attrs}.index == {index}")
        submit(cluster, namespace, claim, name, node)
    for name in ("on-0", "on-1"):
        wait_until(lambda n=name: pod_node(cluster, namespace, n), 90, f"{name} bound", scheduler)

    fault(cluster, publisher, backend, 0)
    assert [t["effect"] for t in taints(cluster, node)["gpu-0"]] == ["NoExecute"]
    evicted = wait_until(lambda: eviction(cluster, namespace, "on-0"), 90, "on-0 evicted", scheduler)
    assert evicted == "DeletionByDeviceTaintManager", evicted
    assert eviction(cluster, namespace, "on-1") == ""  # its GPU is healthy


def pod_node(cluster: ControlPlane, namespace: str, pod: str) -> str:
    got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod}") or {}
    return str((got.get("spec") or {}).get("nodeName") or "")


def eviction(cluster: ControlPlane, namespace: str, pod: str) -> str:
    """The reason of the pod's DisruptionTarget condition once it is being deleted (or `gone`)."""
    got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    if not got:
        return "gone"
    if not got["metadata"].get("deletionTimestamp"):
        return ""
    for cond in (got.get("status") or {}).get("conditions") or []:
        if cond["type"] == "DisruptionTarget" and cond["status"] == "True":
            return str(cond.get("reason", ""))
    return "deleted without DisruptionTarget"
