"""The extender's view of nodes, GPUs and who uses them, kept from Node and Pod objects.

Nodes carry `tessera.io/gpus` (api.gpu_inventory); pods that hold GPUs carry `tessera.io/assignment`
(api.assignment). A pod's request comes from its containers' `tessera.io/gpu`, `gpu-memory` and
`gpu-compute` limits (or requests); class and profile from `tessera.io/workload` and `tessera.io/profile`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from tessera.api import contract
from tessera.api.assignment import Assignment, AssignmentError
from tessera.api.gpu_inventory import GpuInventoryError, parse_node_gpus
from tessera.policy.lanes.placement import GpuState, Request, Tenant, WorkloadClass

log = logging.getLogger(__name__)
JsonObj = dict[str, Any]
PROFILES = {"compute": 1.0, "memory": 0.0, "unknown": 0.5}


class PodRequestError(ValueError):
    """A pod whose GPU request cannot be understood, with the reason."""


def pod_key(pod: JsonObj) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def _quantity(value: Any, what: str, key: str) -> int:
    try:
        number = float(str(value))
    except ValueError:
        raise PodRequestError(f"{key}: {what} must be a whole number, got {value!r}") from None
    if number != int(number) or number < 0:
        raise PodRequestError(f"{key}: {what} must be a whole non-negative number, got {value!r}")
    return int(number)


def pod_request(pod: JsonObj, gpu_memory_mib: int | None = None) -> Request | None:
    """The pod's GPU request, or None when it asks for no Tessera GPU resource.

    Memory defaults to the whole GPU (`gpu_memory_mib`, needed then), compute to the pod's memory fraction
    of the GPU rounded up (a whole GPU when memory is whole).
    """
    key = pod_key(pod)
    totals = {contract.RESOURCE_GPU: 0, contract.RESOURCE_GPU_MEMORY: 0, contract.RESOURCE_GPU_COMPUTE: 0}
    seen = False
    for c in pod.get("spec", {}).get("containers", []) or []:
        res = c.get("resources", {}) or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name in totals:
            if name in merged:
                seen = True
                totals[name] += _quantity(merged[name], name, key)
    if not seen:
        return None
    gpus = totals[contract.RESOURCE_GPU] or 1
    memory = totals[contract.RESOURCE_GPU_MEMORY]
    compute = totals[contract.RESOURCE_GPU_COMPUTE]
    if memory == 0:
        if gpu_memory_mib is None:
            raise PodRequestError(
                f"{key}: no {contract.RESOURCE_GPU_MEMORY} given and no GPU size to default to"
            )
        memory = gpu_memory_mib
    if compute == 0:
        compute = (
            100 if gpu_memory_mib is None else min(100, max(1, math.ceil(100 * memory / gpu_memory_mib)))
        )
    if compute > 100:
        raise PodRequestError(
            f"{key}: {contract.RESOURCE_GPU_COMPUTE} is a percent of one GPU, got {compute}"
        )
    ann = pod.get("metadata", {}).get("annotations", {}) or {}
    return Request(gpus, memory, compute, _profile(ann, key), _class(ann, key))


def _profile(ann: dict[str, str], key: str) -> float:
    raw = ann.get(contract.ANN_PROFILE, "unknown").strip()
    if raw in PROFILES:
        return PROFILES[raw]
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise PodRequestError(
            f"{key}: {contract.ANN_PROFILE} must be compute, memory, unknown or a fraction in [0, 1], got {raw!r}"
        )
    return value


def _class(ann: dict[str, str], key: str) -> WorkloadClass:
    raw = ann.get(contract.ANN_WORKLOAD, "")
    klass = raw.split(":", 1)[1].strip() if ":" in raw else contract.CLASS_BEST_EFFORT
    if klass == contract.CLASS_LATENCY_CRITICAL:
        return "latency-critical"
    if klass == contract.CLASS_BEST_EFFORT:
        return "best-effort"
    raise PodRequestError(
        f"{key}: {contract.ANN_WORKLOAD} class must be {contract.CLASS_LATENCY_CRITICAL} or "
        f"{contract.CLASS_BEST_EFFORT}, got {klass!r}"
    )


@dataclass
class Holding:
    node: str
    gpu_indices: tuple[int, ...]
    lane_id: str
    tenant: Tenant


class ClusterView:
    """Nodes' GPUs and the pods holding them; mutated by watch events and by the extender's own binds."""

    def __init__(self) -> None:
        self.nodes: dict[str, list[GpuState]] = {}
        self.node_errors: dict[str, str] = {}
        self.holdings: dict[str, Holding] = {}  # pod uid → what it holds
        self.pods: dict[str, JsonObj] = {}  # "ns/name" → pod object (latest seen)

    # -- nodes ------------------------------------------------------------------------------------
    def apply_node(self, node: JsonObj) -> None:
        name = node["metadata"]["name"]
        raw = (node["metadata"].get("annotations") or {}).get(contract.ANN_NODE_GPUS)
        if raw is None:
            self.nodes.pop(name, None)
            self.node_errors[name] = f"node has no {contract.ANN_NODE_GPUS} annotation (no Tessera agent?)"
            return
        try:
            inventory = parse_node_gpus(raw, node=name)
        except GpuInventoryError as err:
            self.nodes.pop(name, None)
            self.node_errors[name] = str(err)
            log.warning("%s", err)
            return
        self.node_errors.pop(name, None)
        self.nodes[name] = [GpuState(g.index, g.uuid, g.memory_mib, g.healthy) for g in inventory]
        for holding in self.holdings.values():
            if holding.node == name:
                self._attach(holding)

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.node_errors.pop(name, None)

    # -- pods -------------------------------------------------------------------------------------
    def apply_pod(self, pod: JsonObj) -> None:
        meta = pod["metadata"]
        uid = meta.get("uid", pod_key(pod))
        self.pods[pod_key(pod)] = pod
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
            self.release(uid)
            return
        raw = (meta.get("annotations") or {}).get(contract.ANN_ASSIGNMENT)
        if raw is None or uid in self.holdings:
            return
        try:
            a = Assignment.parse(raw, where=pod_key(pod))
            req = pod_request(pod, a.memory_mib)
        except (AssignmentError, PodRequestError) as err:
            log.warning("ignoring the GPUs of %s: %s", pod_key(pod), err)
            return
        tenant = Tenant(a.memory_mib, a.compute_percent)
        if req is not None:
            tenant = Tenant(a.memory_mib, a.compute_percent, req.compute_fraction, req.workload_class)
        self.hold(uid, Holding(a.node, tuple(a.gpu_indices), a.lane_id, tenant))

    def delete_pod(self, pod: JsonObj) -> None:
        self.pods.pop(pod_key(pod), None)
        self.release(pod["metadata"].get("uid", pod_key(pod)))

    def hold(self, uid: str, holding: Holding) -> None:
        self.release(uid)
        self.holdings[uid] = holding
        self._attach(holding)

    def release(self, uid: str) -> None:
        holding = self.holdings.pop(uid, None)
        if holding is None or holding.node not in self.nodes:
            return
        for gpu in self.nodes[holding.node]:
            if gpu.index in holding.gpu_indices:
                gpu.tenants = [t for t in gpu.tenants if t is not holding.tenant]

    def lane_id(self, node: str, gpu_index: int) -> str:
        """A lane id not used on this GPU: g<index>-l<n> with the smallest free n."""
        taken = {
            h.lane_id for h in self.holdings.values() if h.node == node and h.gpu_indices[:1] == (gpu_index,)
        }
        n = 1
        while f"g{gpu_index}-l{n}" in taken:
            n += 1
        return f"g{gpu_index}-l{n}"

    def _attach(self, holding: Holding) -> None:
        for gpu in self.nodes.get(holding.node, []):
            if gpu.index in holding.gpu_indices and not any(t is holding.tenant for t in gpu.tenants):
                gpu.tenants.append(holding.tenant)
