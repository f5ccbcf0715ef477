"""The operator's view of the cluster: nodes' GPU inventories and the pods that hold GPUs.

Fed by watch events (Node and Pod bodies); turned into a `tessera.cluster.Cluster` for the policies and
into the set of GPUs that pods not owned by an App occupy. Pure data: no API calls here.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract
from tessera.api.assignment import Assignment, AssignmentError
from tessera.api.gpu_inventory import GpuInfo, GpuInventoryError, parse_node_gpus
from tessera.api.placement import PlacementAnnotation, PlacementAnnotationError
from tessera.cluster import GPU, Cluster, Machine

log = logging.getLogger(__name__)

RACK_LABEL = "topology.kubernetes.io/zone"
"""Node label read as the rack (Themis' cross-rack slowdown); nodes without it share one rack."""

_DONE_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the controller needs of a pod: who owns it, where it runs, and how far it got."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str | None
    gpu_indices: tuple[int, ...]
    phase: str
    deleting: bool
    progress_iterations: int | None = None
    progress_loss: float | None = None  # the metric the workload reported with its progress
    bound: bool = False  # spec.nodeName set: the scheduler has placed it

    @property
    def holds_gpus(self) -> bool:
        return bool(self.node and self.gpu_indices) and self.phase not in _DONE_PHASES

    @property
    def finished(self) -> bool:
        return self.phase in _DONE_PHASES


def parse_progress(raw: str | None) -> int | None:
    """Iterations done from `tessera.io/progress` (JSON {"iterations": n, ...}, tessera_agent.lanes.progress)."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("ignoring tessera.io/progress that is not JSON: %r", raw[:80])
        return None
    value = data.get("iterations") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        log.warning("ignoring tessera.io/progress without a whole iterations count: %r", raw[:80])
        return None
    return value


def parse_progress_loss(raw: str | None) -> float | None:
    """The `loss` of `tessera.io/progress` (tessera.sdk.report_progress(..., loss=x)); None when absent."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return None  # parse_progress already warned
    value = data.get("loss") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    """Read a Pod body. Assignment (written at bind) wins over placement (what the operator asked)."""
    meta = body.get("metadata") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    node: str | None = None
    indices: tuple[int, ...] = ()
    if contract.ANN_ASSIGNMENT in ann:
        try:
            a = Assignment.parse(ann[contract.ANN_ASSIGNMENT], where=where)
            node, indices = a.node, tuple(a.gpu_indices)
        except AssignmentError as err:
            log.warning("%s", err)
    if not indices and contract.ANN_PLACEMENT in ann:
        try:
            p = PlacementAnnotation.parse(ann[contract.ANN_PLACEMENT], where=where)
            node, indices = p.node, tuple(p.gpu_indices)
        except PlacementAnnotationError as err:
            log.warning("%s", err)
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        node=node,
        gpu_indices=indices,
        phase=str((body.get("status") or {}).get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        progress_iterations=parse_progress(ann.get(contract.ANN_PROGRESS)),
        progress_loss=parse_progress_loss(ann.get(contract.ANN_PROGRESS)),
        bound=bool((body.get("spec") or {}).get("nodeName")),
    )


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    rack: str
    gpus: tuple[GpuInfo, ...]


def node_info(body: Mapping[str, Any]) -> NodeInfo | None:
    """A Node with a valid `tessera.io/gpus` annotation, or None (not a Tessera GPU node / bad inventory)."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    raw = (meta.get("annotations") or {}).get(contract.ANN_NODE_GPUS)
    if not raw:
        return None
    try:
        gpus = parse_node_gpus(raw, node=name)
    except GpuInventoryError as err:
        log.warning("ignoring node: %s", err)
        return None
    rack = str((meta.get("labels") or {}).get(RACK_LABEL, "rack-0"))
    return NodeInfo(name, rack, tuple(gpus))


def gpu_id(node: str, index: int) -> str:
    """The policies' GPU id. Node + index (not UUID) so placements map back without a lookup."""
    return f"{node}/{index}"


def split_gpu_id(gid: str) -> tuple[str, int]:
    node, _, index = gid.rpartition("/")
    return node, int(index)


@dataclass
class ClusterView:
    """Nodes and GPU-holding pods as last seen on the watch streams.

    Pods are also indexed by (namespace, label, value), so an owner's pods (`pods_with`) cost what that
    owner has, not a scan of every pod: an arbiter round looks up each App's pods twice."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods: dict[tuple[str, str], PodInfo] = field(default_factory=dict)
    version: int = 0
    _by_label: dict[tuple[str, str, str], dict[str, PodInfo]] = field(
        default_factory=dict, init=False, repr=False
    )
    # cluster() built once per change of the nodes: every pass of every TrialGroup and ModelDeployment
    # asks for it, and at 1,000 nodes building it (5,000 GPUs) was most of the operator's time on arrival.
    _nodes_version: int = field(default=0, init=False, repr=False)
    _cluster: tuple[int, Cluster] | None = field(default=None, init=False, repr=False)

    def on_node(self, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """Whether the node's GPUs as the policies see them changed. Most node events are status
        heartbeats (every node, every few minutes), which change nothing here and must not start rounds."""
        name = str((body.get("metadata") or {}).get("name", ""))
        info = None if deleted else node_info(body)
        if self.nodes.get(name) == info:
            return False
        if info is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = info
        self.version += 1
        self._nodes_version += 1
        return True

    def on_pod(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        info = pod_info(body)
        key = (info.namespace, info.name)
        old = self.pods.pop(key, None) if deleted else self.pods.get(key)
        if old is not None:
            for label, value in old.labels.items():
                if deleted or info.labels.get(label) != value:
                    self._unindex((old.namespace, label, value), old.name)
        if not deleted:
            self.pods[key] = info
            for label, value in info.labels.items():
                self._by_label.setdefault((info.namespace, label, value), {})[info.name] = info
        self.version += 1

    def _unindex(self, key: tuple[str, str, str], name: str) -> None:
        owned = self._by_label.get(key)
        if owned is not None:
            owned.pop(name, None)
            if not owned:
                del self._by_label[key]

    def cluster(self) -> Cluster:
        """Every node's GPUs (unhealthy ones included: they are kept out of the free set instead). Shared
        by every caller until the nodes change: callers must not modify it."""
        if self._cluster is None or self._cluster[0] != self._nodes_version:
            self._cluster = (self._nodes_version, self._build_cluster())
        return self._cluster[1]

    def _build_cluster(self) -> Cluster:
        machines = []
        for n in sorted(self.nodes.values(), key=lambda n: (n.rack, n.name)):
            gpus = tuple(
                GPU(
                    id=gpu_id(n.name, g.index),
                    node=n.name,
                    index=g.index,
                    rack=n.rack,
                    model=g.model or "generic",
                    memory_mib=g.memory_mib,
                    healthy=g.healthy,
                )
                for g in n.gpus
            )
            machines.append(Machine(name=n.name, rack=n.rack, gpus=gpus))
        return Cluster(tuple(machines))

    def pods_with(self, label: str, value: str, namespace: str) -> list[PodInfo]:
        return list(self._by_label.get((namespace, label, value), {}).values())

    def used_by_pods(self, exclude_label: str | None = None) -> set[str]:
        """GPU ids that live pods hold, skipping pods that carry `exclude_label` (accounted elsewhere)."""
        out: set[str] = set()
        for p in self.pods.values():
            if not p.holds_gpus or (exclude_label and exclude_label in p.labels):
                continue
            assert p.node is not None
            out.update(gpu_id(p.node, i) for i in p.gpu_indices)
        return out


def healthy_gpus(cluster: Cluster) -> list[str]:
    return [g.id for g in cluster.gpus if g.healthy]


def group_by_node(gpu_ids: Iterable[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for gid in gpu_ids:
        node, index = split_gpu_id(gid)
        out.setdefault(node, []).append(index)
    return {n: sorted(ix) for n, ix in sorted(out.items())}
