"""The extender's view of nodes, GPUs and who uses them, kept from Node and Pod objects.

Nodes carry `tessera.io/gpus` (api.gpu_inventory); pods that hold GPUs carry `tessera.io/assignment`
(api.assignment). A pod's request comes from its containers' `tessera.io/gpu`, `gpu-memory` and
`gpu-compute` limits (or requests), read by api.quantity (canonical quantities: `8k` is 8000 MiB, `16Gi`
16384 MiB); class and profile from `tessera.io/workload` and `tessera.io/profile`. A pod whose workload
annotation names no class is latency-critical when its `priorityClassName` is one of the HP priority
classes, the node agent's rule for HP lanes (tessera_agent.lanes.book.lane_class), so the two never disagree on
which pods may not share a GPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from kubernetes.utils.quantity import parse_quantity

from tessera.api import contract
from tessera.api.assignment import Assignment, AssignmentError
from tessera.api.gpu_inventory import GpuInventoryError, parse_node_gpus
from tessera.api.placement import PlacementAnnotation, PlacementAnnotationError
from tessera.api.quantity import QuantityError, pod_totals
from tessera.extender.claims import (
    ClaimReadError,
    ClaimRequest,
    claim_request,
    claim_shares,
    combine,
    is_extended_resource_claim,
    pod_claim_names,
    uses_claims,
)
from tessera.extender.node_selection import NodeFacts
from tessera.policy.lanes.fragmentation import PackingState, Shape, ShapeDistribution
from tessera.policy.lanes.placement import (
    PROFILE_FRACTION,
    Choice,
    FitIndex,
    GpuRequest,
    GpuState,
    NodeSummary,
    PlacementConfig,
    PlacementError,
    Tenant,
    WorkloadClass,
)
from tessera.policy.orion.profiles import Profile

log = logging.getLogger(__name__)
JsonObj = dict[str, Any]
# tessera.io/profile names: Orion's profiles, with the fractions the interference score uses.
PROFILES = {p.name.lower(): PROFILE_FRACTION[p] for p in Profile}
# priorityClassNames that make a pod latency-critical when tessera.io/workload names no class (the agent's
# --hp-priority-class default; the extender's --hp-priority-class sets others).
DEFAULT_HP_PRIORITY_CLASSES: tuple[str, ...] = (contract.CLASS_LATENCY_CRITICAL,)
# Pod annotation: the GPU models the pod may run on, `|`- or `,`-separated (Alibaba's gpu_spec); matched
# against the `model` of each GPU in the node's tessera.io/gpus annotation. Absent: any model.
ANN_GPU_MODELS = contract.ANN_GPU_MODELS
UNLIMITED = float("inf")  # a node without status.allocatable for CPU or memory: not a constraint
# Holdings of allocated ResourceClaims are keyed claim/<claim uid>/<n> (a pod's UID has no /).
CLAIM_HOLD = "claim/"


def gpu_models(pod: JsonObj) -> frozenset[str] | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_GPU_MODELS)
    if raw is None or not str(raw).strip():
        return None
    return frozenset(m.strip() for m in str(raw).replace(",", "|").split("|") if m.strip())


def _quantity(value: object, scale: float) -> float:
    """A CPU (scale 1000: milli) or memory (scale 1/2^20: MiB) quantity; bad ones raise PodRequestError."""
    try:
        amount = float(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as err:
        raise PodRequestError(f"bad quantity {value!r}: {err}") from None
    # parse_quantity takes `1e999` (infinite: the pod would fit nowhere) and `-1`; the API server refuses both
    if not 0 <= amount < math.inf:
        raise PodRequestError(f"bad quantity {value!r}: must be a finite amount >= 0")
    return amount * scale


def _positive(quantity: object) -> bool:
    """A node's allocatable count above zero (an unreadable one counts as none, as kube-scheduler would fail it)."""
    try:
        return _quantity(quantity, 1) > 0
    except PodRequestError:
        return False


def pod_cpu_memory(pod: JsonObj) -> tuple[float, float]:
    """CPU (milli) and memory (MiB) the pod requests: the sum over its containers' requests (limits when no
    request is given, as the API server defaults them)."""
    cpu = mem = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        if "cpu" in merged:
            cpu += _quantity(merged["cpu"], 1000.0)
        if "memory" in merged:
            mem += _quantity(merged["memory"], 1.0 / (1 << 20))
    return cpu, mem


def node_allocatable(node: JsonObj) -> tuple[float, float]:
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = _quantity(alloc["cpu"], 1000.0) if "cpu" in alloc else UNLIMITED
        mem = _quantity(alloc["memory"], 1.0 / (1 << 20)) if "memory" in alloc else UNLIMITED
    except PodRequestError:
        return UNLIMITED, UNLIMITED
    return cpu, mem


def shape_of(spec: PodRequest | None, pod: JsonObj, default_gpu_memory: int | None) -> Shape | None:
    """The pod's shape for fragmentation scoring, or None when it has no fixed one (bad request, a placement
    fixed by the operator). Memory not given is the whole GPU (as PodRequest.resolve); compute not given is the
    memory's share of `default_gpu_memory` (the cluster's smallest GPU)."""
    try:
        cpu, mem = pod_cpu_memory(pod)
    except PodRequestError:
        return None
    models = gpu_models(pod)
    if spec is None:
        return Shape(0, 0.0, cpu_milli=cpu, memory_mib=mem, models=None)
    if spec.problem or spec.placement_problem or spec.placement is not None:
        return None
    if spec.memory_mib:
        if spec.compute_percent:
            compute = spec.compute_percent / 100.0
        elif default_gpu_memory:
            compute = min(100, max(1, math.ceil(100 * spec.memory_mib / default_gpu_memory))) / 100.0
        else:
            compute = 1.0
        return Shape(spec.gpus, compute, float(spec.memory_mib), 0.0, cpu, mem, models)
    compute = spec.compute_percent / 100.0 if spec.compute_percent else 1.0
    return Shape(spec.gpus, compute, 0.0, 1.0, cpu, mem, models)


class PodRequestError(ValueError):
    """A pod whose GPU request cannot be understood, with the reason."""


def claim_key(claim: JsonObj) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_key(pod: JsonObj) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's GPU request as written, parsed once per scheduling cycle (cached by UID in the extender).

    `memory_mib` / `compute_percent` are 0 when not given: they default per node, from its GPU size, in
    `resolve`. `problem` is why the pod cannot be placed anywhere (bad quantities, bad placement).
    """

    key: str
    gpus: int
    memory_mib: int
    compute_percent: int
    compute_fraction: float
    workload_class: WorkloadClass
    placement: PlacementAnnotation | None = None
    problem: str | None = None  # the request itself is bad
    placement_problem: str | None = None  # the tessera.io/placement annotation is bad

    def resolve(self, gpu_memory_mib: int | None) -> GpuRequest:
        """The request on a node whose smallest GPU has `gpu_memory_mib` (needed when memory is not given).

        Memory defaults to the whole GPU, compute to the pod's memory fraction of the GPU rounded up (a
        whole GPU when memory is whole).
        """
        memory, compute = self.memory_mib, self.compute_percent
        if memory == 0:
            if gpu_memory_mib is None:
                raise PodRequestError(
                    f"{self.key}: no {contract.RESOURCE_GPU_MEMORY} given and no GPU size to default to"
                )
            memory = gpu_memory_mib
        if compute == 0:
            compute = (
                100 if gpu_memory_mib is None else min(100, max(1, math.ceil(100 * memory / gpu_memory_mib)))
            )
        try:
            return GpuRequest(self.gpus, memory, compute, self.compute_fraction, self.workload_class)
        except PlacementError as err:
            raise PodRequestError(f"{self.key}: {err}") from None


def pod_spec(
    pod: JsonObj, hp_priority_classes: Collection[str] = DEFAULT_HP_PRIORITY_CLASSES
) -> PodRequest | None:
    """Parse the pod's GPU request, class, profile and placement; None when it asks for no Tessera GPU.

    `hp_priority_classes`: the priority classes that make a pod latency-critical when its workload
    annotation names no class.
    """
    key = pod_key(pod)
    ann = pod.get("metadata", {}).get("annotations", {}) or {}
    try:
        try:
            found = pod_totals(pod.get("spec") or {})
        except QuantityError as err:
            raise PodRequestError(f"{key}: {err}") from None
        if found is None:
            return None
        totals = found
        compute = totals[contract.RESOURCE_GPU_COMPUTE]
        if compute > 100:
            raise PodRequestError(
                f"{key}: {contract.RESOURCE_GPU_COMPUTE} is a percent of one GPU, got {compute}"
            )
        priority_class = (pod.get("spec") or {}).get("priorityClassName") or ""
        profile, klass = _profile(ann, key), _class(ann, key, priority_class, hp_priority_classes)
    except PodRequestError as err:
        return PodRequest(key, 1, 0, 0, 0.5, "best-effort", problem=str(err))
    spec = PodRequest(
        key,
        totals[contract.RESOURCE_GPU] or 1,
        totals[contract.RESOURCE_GPU_MEMORY],
        compute,
        profile,
        klass,
    )
    if contract.ANN_PLACEMENT in ann:
        try:
            placement = PlacementAnnotation.parse(ann[contract.ANN_PLACEMENT], where=key)
        except PlacementAnnotationError as err:
            return PodRequest(
                key, spec.gpus, spec.memory_mib, compute, profile, klass, placement_problem=str(err)
            )
        return PodRequest(key, spec.gpus, spec.memory_mib, compute, profile, klass, placement)
    return spec


def pod_request(pod: JsonObj, gpu_memory_mib: int | None = None) -> GpuRequest | None:
    """The pod's GPU request on GPUs of `gpu_memory_mib`, or None when it asks for no Tessera GPU resource."""
    spec = pod_spec(pod)
    if spec is None:
        return None
    if spec.problem is not None:
        raise PodRequestError(spec.problem)
    return spec.resolve(gpu_memory_mib)


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


def _class(
    ann: dict[str, str], key: str, priority_class: str, hp_priority_classes: Collection[str]
) -> WorkloadClass:
    raw = ann.get(contract.ANN_WORKLOAD, "")
    if ":" in raw:
        klass = raw.split(":", 1)[1].strip()
    elif priority_class in hp_priority_classes:
        klass = contract.CLASS_LATENCY_CRITICAL
    else:
        klass = contract.CLASS_BEST_EFFORT
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


class SchedulerCache:
    """Nodes' GPUs and the pods holding them; mutated by watch events and by the extender's own binds.

    Keeps a NodeSummary per node, dropped whenever that node or a pod on it changes and rebuilt on first use,
    so filtering a node costs a few comparisons; with it a memo of what choose_gpus said for each request on
    that node (a pod of an already-seen shape costs a dict lookup per node until the node changes). A FitIndex
    holds every node's free memory and compute room in arrays, its rows rewritten for the nodes changed since
    the last filter. `generation` counts changes (filter results stay valid for prioritize while unchanged).
    """

    MEMO_PER_NODE = 64  # distinct requests remembered per node before its memo starts over

    def __init__(self, hp_priority_classes: Collection[str] = DEFAULT_HP_PRIORITY_CLASSES) -> None:
        self.hp_priority_classes = frozenset(hp_priority_classes)
        self.nodes: dict[str, list[GpuState]] = {}
        self.node_errors: dict[str, str] = {}
        self.node_facts: dict[str, NodeFacts] = {}  # every node's labels and taints (what bind checks)
        self.holdings: dict[str, Holding] = {}  # pod uid → what it holds
        self.pods: dict[str, JsonObj] = {}  # "ns/name" → pod object (latest seen)
        self.generation = 0
        self._holds_taken = 0  # holds ever taken; `_held_at[uid]` is the count when uid's was taken
        self._held_at: dict[str, int] = {}
        self._summaries: dict[str, tuple[PlacementConfig, NodeSummary, dict[int, Choice | str]]] = {}
        self._min_memory: dict[str, int | None] = {}
        self._on_node: dict[str, set[str]] = {}  # node → uids holding GPUs there
        self._index: FitIndex | None = None
        self._row: dict[str, int] = {}  # node → its FitIndex row (kept when the node goes, for its return)
        self._dirty: set[str] = set()  # nodes whose FitIndex row is stale
        self._names: tuple[list[str], npt.NDArray[np.intp]] | None = None  # last NodeNames and their rows
        # CPU/memory, GPU model and the fragmentation-scoring arrays (policy.lanes.fragmentation)
        self.allocatable: dict[str, tuple[float, float]] = {}
        self.models: dict[str, str] = {}
        self._usage: dict[str, tuple[str, float, float]] = {}  # pod uid → (node, CPU milli, memory MiB)
        self._used: dict[str, list[float]] = {}  # node → [CPU milli, memory MiB] requested by its pods
        self.packing = PackingState()
        self._prow: dict[str, int] = {}
        self._pcols: dict[str, list[int]] = {}  # node → GPU index of each packing column
        self._pdirty: set[str] = set()
        self._pnames: tuple[list[str], npt.NDArray[np.intp]] | None = None
        self.distribution: ShapeDistribution | None = None  # set: every new pod seen is observed
        self._seen: dict[str, None] = {}
        self._smallest: tuple[int, int | None] | None = None
        # ResourceClaims (lanes.api dra): "ns/name" → the claim's request of gpu.tessera.io (None: asks none),
        # or why it cannot be scored by; what allocated claims hold is kept as holdings "claim/<uid>/<n>".
        self.read_claims = False  # set by the extender with --dra-claims
        self.claims: dict[str, ClaimRequest | str | None] = {}
        self._claim_holds: dict[str, list[str]] = {}  # claim "ns/name" → its holding keys
        # pod uid → the claim kube-scheduler made for its tessera.io/gpu (KEP-5004): counted until the pod's
        # own tessera.io/assignment is, never both
        self._extended: dict[str, str] = {}
        # nodes whose allocatable lists tessera.io/gpu: a device plugin serves it there, and kube-scheduler's
        # DynamicResources plugin makes no claim for it (it serves only nodes that advertise none)
        self.device_plugin_nodes: set[str] = set()

    def _changed(self, node: str) -> None:
        self.generation += 1
        self._summaries.pop(node, None)
        self._dirty.add(node)
        self._pdirty.add(node)

    # -- CPU, memory, models and the packing arrays ------------------------------------------------------
    def node_free(self, node: str) -> tuple[float, float]:
        cpu, mem = self.allocatable.get(node, (UNLIMITED, UNLIMITED))
        used = self._used.get(node, [0.0, 0.0])
        return cpu - used[0], mem - used[1]

    def why_not_node(self, node: str, shape: Shape) -> str | None:
        """None when the node has the CPU, memory and GPU model `shape` asks for; else why not."""
        if shape.models is not None and self.models.get(node, "") not in shape.models:
            return f"node's GPUs are {self.models.get(node) or 'of no named model'}, pod wants {'|'.join(sorted(shape.models))}"
        cpu, mem = self.node_free(node)
        if shape.cpu_milli > cpu + 1e-9:
            return f"node has {cpu:.0f}m CPU free, pod needs {shape.cpu_milli:.0f}m"
        if shape.memory_mib > mem + 1e-9:
            return f"node has {mem:.0f} MiB memory free, pod needs {shape.memory_mib:.0f} MiB"
        return None

    def reserve(self, uid: str, node: str, cpu: float, mem: float) -> None:
        """Count a pod's CPU and memory on `node` (by uid: a second call for the pod replaces the first)."""
        self.unreserve(uid)
        if not cpu and not mem:
            return
        self._usage[uid] = (node, cpu, mem)
        used = self._used.setdefault(node, [0.0, 0.0])
        used[0] += cpu
        used[1] += mem
        self._changed(node)

    def footprint(self, uid: str) -> str | None:
        """The node where the pod holds GPUs, CPU or memory in this view, if any."""
        holding = self.holdings.get(uid)
        if holding is not None:
            return holding.node
        usage = self._usage.get(uid)
        return usage[0] if usage is not None else None

    def unreserve(self, uid: str) -> None:
        old = self._usage.pop(uid, None)
        if old is not None:
            used = self._used[old[0]]
            used[0] -= old[1]
            used[1] -= old[2]
            self._changed(old[0])

    def observe(self, pod: JsonObj, shape: Shape | None) -> None:
        """Teach the shape distribution a pod seen for the first time (by uid)."""
        if self.distribution is None or shape is None:
            return
        uid = pod["metadata"].get("uid") or pod_key(pod)
        if uid in self._seen:
            return
        self._seen[uid] = None
        if len(self._seen) > 100_000:
            del self._seen[next(iter(self._seen))]
        self.distribution.observe(shape)

    def packing_state(self) -> PackingState:
        """The fragmentation-scoring arrays, rows of changed nodes rewritten first."""
        st = self.packing
        for node in self._pdirty:
            row = self._prow.get(node)
            if row is None:
                if node not in self.nodes:
                    continue
                row = self._prow[node] = st.add_row()
                self._pnames = None
            gpus = [g for g in self.nodes.get(node) or () if g.healthy]
            if node not in self.nodes:
                st.clear_row(row)
                continue
            cpu, mem = self.node_free(node)
            cap = self.allocatable.get(node, (UNLIMITED, UNLIMITED))
            self._pcols[node] = [g.index for g in gpus]
            st.set_row(
                row,
                model=self.models.get(node, ""),
                gpu_memory_mib=[g.memory_mib for g in gpus],
                free_compute=[(100 - g.used_compute) / 100.0 for g in gpus],
                free_memory_mib=[g.memory_mib - g.used_memory for g in gpus],
                cpu_free=cpu,
                memory_free=mem,
                cpu_capacity=cap[0],
                memory_capacity=cap[1],
            )
        self._pdirty.clear()
        return st

    def packing_rows(self, names: list[str]) -> npt.NDArray[np.intp]:
        """Packing rows of `names` (−1 for nodes without one); call after packing_state."""
        last = self._pnames
        if last is not None and last[0] == names:
            return last[1]
        get = self._prow.get
        rows = np.fromiter((get(n, -1) for n in names), dtype=np.intp, count=len(names))
        self._pnames = (list(names), rows)
        return rows

    def gpu_indices(self, node: str, columns: tuple[int, ...]) -> tuple[int, ...]:
        cols = self._pcols[node]
        return tuple(sorted(cols[c] for c in columns))

    def summary(self, node: str, cfg: PlacementConfig) -> NodeSummary | None:
        """The node's summary under `cfg`, or None for a node without a usable GPU inventory."""
        cached = self._summaries.get(node)
        if cached is not None and cached[0] is cfg:
            return cached[1]
        gpus = self.nodes.get(node)
        if gpus is None:
            return None
        summary = NodeSummary.of(gpus, cfg)
        self._summaries[node] = (cfg, summary, {})
        return summary

    def memo(self, node: str, cfg: PlacementConfig) -> dict[int, Choice | str] | None:
        """What choose_gpus said on `node` under `cfg`, by request key; dropped when the node changes."""
        cached = self._summaries.get(node)
        if cached is None or cached[0] is not cfg:
            if self.summary(node, cfg) is None:
                return None
            cached = self._summaries[node]
        if len(cached[2]) >= self.MEMO_PER_NODE:
            cached[2].clear()
        return cached[2]

    def fit_index(self, cfg: PlacementConfig) -> FitIndex:
        """The FitIndex of every node under `cfg`, its stale rows rewritten first."""
        index = self._index
        if index is None or index.cfg is not cfg:
            index = self._index = FitIndex(cfg, width=max((len(g) for g in self.nodes.values()), default=8))
            self._row.clear()
            self._names = None
            self._dirty = set(self.nodes)
        for node in self._dirty:
            row = self._row.get(node)
            if row is None:
                if node not in self.nodes:
                    continue
                row = self._row[node] = index.add_row()
                self._names = None  # a name that mapped to the empty row may now have one
            index.set_row(row, self.nodes.get(node))
        self._dirty.clear()
        return index

    def rows(self, names: list[str]) -> npt.NDArray[np.intp]:
        """FitIndex rows of `names` (0 for unknown nodes); the last list's rows are reused when it repeats.

        Call after fit_index (which assigns rows to new nodes).
        """
        last = self._names
        if last is not None and last[0] == names:
            return last[1]
        get = self._row.get
        rows = np.fromiter((get(n, 0) for n in names), dtype=np.intp, count=len(names))
        self._names = (list(names), rows)
        return rows

    def smallest_gpu_memory(self) -> int | None:
        """The smallest GPU memory of any node (what a pod asking for memory but no compute is scored on)."""
        if self._smallest is None or self._smallest[0] != len(self._min_memory):
            values = [v for v in self._min_memory.values() if v is not None]
            self._smallest = (len(self._min_memory), min(values, default=None))
        return self._smallest[1]

    def min_memory(self, node: str) -> int | None:
        """The node's smallest GPU memory (what a pod without a memory request defaults to)."""
        return self._min_memory.get(node)

    # -- nodes ------------------------------------------------------------------------------------
    def apply_node(self, node: JsonObj) -> None:
        name = node["metadata"]["name"]
        self._changed(name)
        self.node_facts[name] = NodeFacts.of(node)
        # every node's CPU and memory: pods asking for no GPU may go to nodes without GPUs
        self.allocatable[name] = node_allocatable(node)
        # kube-scheduler's rule (DynamicResources, filterExtendedResources): a node whose allocatable counts
        # none of the resource serves it through DRA, also when a device plugin once registered it (the
        # kubelet keeps the name at 0 after the plugin goes)
        gpus = ((node.get("status") or {}).get("allocatable") or {}).get(contract.RESOURCE_GPU)
        if gpus is not None and _positive(gpus):
            self.device_plugin_nodes.add(name)
        else:
            self.device_plugin_nodes.discard(name)
        raw = (node["metadata"].get("annotations") or {}).get(contract.ANN_NODE_GPUS)
        if raw is None:
            self._drop_node(name)
            self.node_errors[name] = f"node has no {contract.ANN_NODE_GPUS} annotation (no Tessera agent?)"
            return
        try:
            inventory = parse_node_gpus(raw, node=name)
        except GpuInventoryError as err:
            self._drop_node(name)
            self.node_errors[name] = str(err)
            log.warning("%s", err)
            return
        self.node_errors.pop(name, None)
        if name not in self._prow:  # packing rows in the order nodes appear (the rule's last tie-break)
            self._prow[name] = self.packing.add_row()
            self._pnames = None
        self.models[name] = next((g.model for g in inventory if g.model), "")
        self._smallest = None
        self.nodes[name] = [GpuState(g.index, g.uuid, g.memory_mib, g.healthy) for g in inventory]
        self._min_memory[name] = min((g.memory_mib for g in inventory), default=None)
        for uid in self._on_node.get(name, ()):
            self._attach(self.holdings[uid])

    def delete_node(self, name: str) -> None:
        self._changed(name)
        self._drop_node(name)
        self.node_errors.pop(name, None)
        self.node_facts.pop(name, None)
        self.allocatable.pop(name, None)
        self.device_plugin_nodes.discard(name)

    def _drop_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self._min_memory.pop(name, None)

    # -- pods -------------------------------------------------------------------------------------
    def apply_pod(self, pod: JsonObj) -> None:
        meta = pod["metadata"]
        uid = meta.get("uid", pod_key(pod))
        self.pods[pod_key(pod)] = pod
        # A pod being deleted keeps its lanes until its containers have stopped (a terminal phase, or the
        # pod gone): during its grace period it is still running, e.g. checkpointing after SIGTERM, and a
        # successor must not start on its GPU until then (kube-scheduler counts terminating pods too).
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            self.release(uid)
            self.unreserve(uid)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        # A pending pod is part of the workload to pack for; one asking through claims is learnt once its
        # claim is read (prioritize), not as the CPU-only pod its containers alone describe.
        if not node and self.distribution is not None and not (self.read_claims and uses_claims(pod)):
            self.observe(
                pod, shape_of(pod_spec(pod, self.hp_priority_classes), pod, self.smallest_gpu_memory())
            )
        if node:
            try:
                self.reserve(uid, node, *pod_cpu_memory(pod))
            except PodRequestError as err:
                log.warning("%s: CPU/memory request unreadable: %s", pod_key(pod), err)
        raw = (meta.get("annotations") or {}).get(contract.ANN_ASSIGNMENT)
        if raw is None or uid in self.holdings:
            return
        try:
            a = Assignment.parse(raw, where=pod_key(pod))
        except AssignmentError as err:
            log.warning("ignoring the GPUs of %s: %s", pod_key(pod), err)
            return
        try:
            # the view's HP priority classes, as filter and bind read the pod (so its tenant class agrees)
            spec = pod_spec(pod, self.hp_priority_classes)
            if spec is not None and spec.problem is not None:
                raise PodRequestError(spec.problem)
            req = None if spec is None else spec.resolve(a.memory_mib)
        except PodRequestError as err:  # the assignment still says what it holds: count it
            log.warning("%s holds GPUs but its request is unreadable: %s", pod_key(pod), err)
            req = None
        tenant = Tenant(a.memory_mib, a.compute_percent)
        if req is not None:
            tenant = Tenant(a.memory_mib, a.compute_percent, req.compute_fraction, req.workload_class)
        self.hold(uid, Holding(a.node, tuple(a.gpu_indices), a.lane_id, tenant))

    def delete_pod(self, pod: JsonObj) -> None:
        self.pods.pop(pod_key(pod), None)
        self.release(pod["metadata"].get("uid", pod_key(pod)))
        self.unreserve(pod["metadata"].get("uid", pod_key(pod)))

    def mark(self) -> int:
        """A point in the view's history, taken before a list is requested (see replace_pods)."""
        return self._holds_taken

    def replace_nodes(self, nodes: list[JsonObj]) -> None:
        """Make the view's nodes those of a fresh list: nodes gone while no watch was open are dropped."""
        listed = {n["metadata"]["name"] for n in nodes}
        for name in (set(self.nodes) | set(self.node_errors)) - listed:
            self.delete_node(name)
        for node in nodes:
            self.apply_node(node)

    def replace_pods(self, pods: list[JsonObj], mark: int) -> None:
        """Make the view's pods those of a list requested at `mark`: pods gone while no watch was open give
        their GPUs back. Holdings taken after `mark` (binds racing the list) stay: the list may predate
        their pods, whose events the watch from the list's resourceVersion brings."""
        listed_keys = {pod_key(p) for p in pods}
        listed_uids = {p["metadata"].get("uid", pod_key(p)) for p in pods}
        for key in set(self.pods) - listed_keys:
            del self.pods[key]
        for uid in [
            u
            for u, at in self._held_at.items()
            if at <= mark and u not in listed_uids and not u.startswith(CLAIM_HOLD)
        ]:
            self.release(uid)
        for uid in [u for u in self._usage if u not in listed_uids and self._held_at.get(u, 0) <= mark]:
            self.unreserve(uid)
        for pod in pods:
            self.apply_pod(pod)

    # -- ResourceClaims (lanes.api dra) -------------------------------------------------------------------
    def apply_claim(self, claim: JsonObj) -> None:
        """Keep the claim's request (for its pods' shapes) and count what its allocation holds on each GPU."""
        meta = claim.get("metadata") or {}
        key = claim_key(claim)
        try:
            self.claims[key] = claim_request(claim)
        except ClaimReadError as err:
            self.claims[key] = str(err)
        self._release_claim(key)
        if is_extended_resource_claim(claim):
            reserved = [str(c.get("uid")) for c in (claim.get("status") or {}).get("reservedFor") or []]
            for uid in reserved:
                self._extended[uid] = key
            if any(u in self.holdings for u in reserved):
                return  # the pod's tessera.io/assignment counts what it holds
        try:
            shares = claim_shares(claim)
        except ClaimReadError as err:
            log.warning("ignoring what claim %s holds: %s", key, err)
            return
        keys = []
        for n, share in enumerate(shares):
            gpus = {g.index: g for g in self.nodes.get(share.node) or ()}
            memory = share.memory_mib
            if memory is None:  # a whole GPU, as the allocator charges a device without consumed capacity
                if share.gpu_index not in gpus:
                    continue
                memory = gpus[share.gpu_index].memory_mib
            hold_key = f"{CLAIM_HOLD}{meta.get('uid', key)}/{n}"
            self.hold(
                hold_key, Holding(share.node, (share.gpu_index,), "", Tenant(memory, share.compute_percent))
            )
            keys.append(hold_key)
        if keys:
            self._claim_holds[key] = keys

    def delete_claim(self, claim: JsonObj) -> None:
        key = claim_key(claim)
        self.claims.pop(key, None)
        self._release_claim(key)
        self._extended = {u: k for u, k in self._extended.items() if k != key}

    def replace_claims(self, claims: list[JsonObj]) -> None:
        """Make the view's claims those of a fresh list: claims gone while no watch was open free their GPUs."""
        listed = {claim_key(c) for c in claims}
        for key in set(self.claims) - listed:
            self.claims.pop(key, None)
            self._release_claim(key)
        self._extended = {u: k for u, k in self._extended.items() if k in listed}
        for claim in claims:
            self.apply_claim(claim)

    def _release_claim(self, key: str) -> None:
        for hold_key in self._claim_holds.pop(key, ()):
            self.release(hold_key)

    def claim_request(self, pod: JsonObj) -> ClaimRequest | None:
        """The GPUs the pod asks for through its claims (None: none of gpu.tessera.io); ClaimReadError when
        they cannot be read (a claim not seen yet, or asking in a way that has no one size)."""
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        found = []
        for name in pod_claim_names(pod):
            if f"{ns}/{name}" not in self.claims:
                raise ClaimReadError(f"claim {ns}/{name} is not in the extender's view yet")
            got = self.claims[f"{ns}/{name}"]
            if isinstance(got, str):
                raise ClaimReadError(got)
            if got is not None:
                found.append(got)
        return combine(found, f"pod {pod_key(pod)}'s claims")

    def hold(self, uid: str, holding: Holding) -> None:
        claim = self._extended.get(uid)
        if claim is not None:  # the pod's assignment replaces the claim made for its tessera.io/gpu
            self._release_claim(claim)
        self.release(uid)
        self._holds_taken += 1
        self._held_at[uid] = self._holds_taken
        self.holdings[uid] = holding
        self._on_node.setdefault(holding.node, set()).add(uid)
        self._changed(holding.node)
        self._attach(holding)

    def release(self, uid: str) -> None:
        holding = self.holdings.pop(uid, None)
        if holding is None:
            return
        del self._held_at[uid]
        self._on_node.get(holding.node, set()).discard(uid)
        self._changed(holding.node)
        for gpu in self.nodes.get(holding.node, []):
            if gpu.index in holding.gpu_indices:
                gpu.remove(holding.tenant)

    def lane_id(self, node: str, gpu_index: int) -> str:
        """A lane id not used on this GPU: g<index>-l<n> with the smallest free n."""
        taken = {
            self.holdings[uid].lane_id
            for uid in self._on_node.get(node, ())
            if self.holdings[uid].gpu_indices[:1] == (gpu_index,)
        }
        n = 1
        while f"g{gpu_index}-l{n}" in taken:
            n += 1
        return f"g{gpu_index}-l{n}"

    def _attach(self, holding: Holding) -> None:
        for gpu in self.nodes.get(holding.node, []):
            if gpu.index in holding.gpu_indices and not any(t is holding.tenant for t in gpu.tenants):
                gpu.add(holding.tenant)
