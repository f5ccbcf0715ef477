"""The node's GPUs as a DRA ResourceSlice (resource.k8s.io/v1): one device per GPU whose memory and compute
share are consumable capacity, so any scheduler that speaks DRA can cut lanes out of it.

Each device has `allowMultipleAllocations: true` and three capacities with request policies that say which
lanes exist (the same bounds as the extender's assignments, `tessera.api.assignment`):

  memory        the GPU's usable memory (total less the driver reserve and --extra-reserve-mib), in whole MiB;
                a request that names none takes all of it
  computeShare  percent of the SMs, 1..100 in steps of 1 (the MPS active thread percentage); default 100
  clients       MPS client slots, `slotsPerGpu` of them; every allocation takes exactly one, so a GPU carries
                no more lanes than the device plugin would give it (MPS serves at most 48 clients)

so a claim that asks for nothing gets a whole GPU, and one that asks `memory: 10Gi, computeShare: 30` gets a
lane of 10 GiB and 30 %. An unhealthy GPU carries the device taint `gpu.tessera.io/unhealthy` (KEP-5055) with
the configured effect: the scheduler allocates it to no claim that does not tolerate the taint, whatever its
DeviceClass, and with NoExecute the device taint eviction controller evicts the pods of the claims on it.
Pure functions: publishing is `dra_plugin.SlicePublisher`'s job.
"""

from __future__ import annotations

from typing import Any, Literal

from tessera.api import contract

from tessera_agent.gpus.backend import GpuBackend, GpuDevice, usable_memory_mib

API_VERSION = "resource.k8s.io/v1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
TaintEffect = Literal["NoSchedule", "NoExecute"]


def device_name(gpu: GpuDevice) -> str:
    """The device's name in the slice (a DNS label; UUIDs are attributes, not names)."""
    return f"gpu-{gpu.index}"


def slice_name(node: str) -> str:
    return f"{node}-{contract.DRA_DRIVER}"


def _capacity(value: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {"value": value, "requestPolicy": policy}


def _topology(gpu: GpuDevice) -> dict[str, Any]:
    """`pcieRoot` and `numaNode` where known: a claim of several GPUs keeps them under one root complex with
    `constraints: [{matchAttribute: gpu.tessera.io/pcieRoot}]` (or one NUMA node with numaNode)."""
    out: dict[str, Any] = {}
    if gpu.pcie_root:
        out[contract.DRA_ATTRIBUTE_PCIE_ROOT] = {"string": gpu.pcie_root}
    if gpu.numa_node is not None:
        out[contract.DRA_ATTRIBUTE_NUMA_NODE] = {"int": gpu.numa_node}
    return out


def unhealthy_taint(effect: TaintEffect) -> dict[str, Any]:
    """The taint of an unhealthy GPU. No timeAdded: the API server sets it when the taint first appears (the
    publisher carries it over from the published slice after that)."""
    return {"key": contract.DRA_TAINT_UNHEALTHY, "effect": effect}


def device(
    gpu: GpuDevice,
    *,
    slots: int,
    extra_reserve_mib: int = 0,
    healthy: bool | None = None,
    taint_effect: TaintEffect = "NoSchedule",
) -> dict[str, Any]:
    mib = usable_memory_mib(gpu, extra_reserve_mib)
    memory = f"{mib}Mi"
    ok = gpu.healthy if healthy is None else healthy
    taints = {} if ok else {"taints": [unhealthy_taint(taint_effect)]}
    return {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": {
            contract.DRA_ATTRIBUTE_UUID: {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "model": {"string": gpu.model},
            "computeCapability": {"string": gpu.compute_capability},
            "mig": {"bool": gpu.mig},
            "health": {"string": HEALTHY if ok else UNHEALTHY},
            **_topology(gpu),
        },
        "capacity": {
            contract.DRA_CAPACITY_MEMORY: _capacity(
                memory, {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}
            ),
            contract.DRA_CAPACITY_COMPUTE: _capacity(
                "100", {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}
            ),
            contract.DRA_CAPACITY_CLIENTS: _capacity(str(slots), {"default": "1", "validValues": ["1"]}),
        },
        **taints,
    }


def resource_slice(
    node: str,
    backend: GpuBackend,
    *,
    slots: int,
    generation: int,
    extra_reserve_mib: int = 0,
    health: dict[str, bool] | None = None,
    node_uid: str | None = None,
    taint_effect: TaintEffect = "NoSchedule",
) -> dict[str, Any]:
    """The node's ResourceSlice: pool `node`, one slice in it at `generation` (raised on every change, so the
    scheduler never mixes two versions of the pool). Owned by the Node when its UID is known, so the slice
    goes with it."""
    health = health or {}
    meta: dict[str, Any] = {"name": slice_name(node)}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": contract.DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                device(
                    g,
                    slots=slots,
                    extra_reserve_mib=extra_reserve_mib,
                    healthy=health.get(g.uuid),
                    taint_effect=taint_effect,
                )
                for g in backend.gpus()
            ],
        },
    }


def device_class(extended_resource_name: str | None = None) -> dict[str, Any]:
    """The DeviceClass claims name (`deviceClassName: gpu.tessera.io`): the driver's GPUs. Health is not a
    selector here: an unhealthy GPU is tainted, which keeps it from claims of every class. The chart renders
    the same object (tests/unit/agent/test_agent_chart_dra.py compares them), with `extended_resource_name`
    (`tessera.io/gpu`, KEP-5004) where `lanes.dra.extendedResource` names it: a pod asking that extended
    resource then gets whole GPUs of this class through a claim kube-scheduler makes."""
    spec: dict[str, Any] = {
        "selectors": [{"cel": {"expression": f'device.driver == "{contract.DRA_DRIVER}"'}}]
    }
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": contract.DRA_DEVICE_CLASS},
        "spec": spec,
    }
