"""Where the agent learns which pods on its node hold a lane: a small interface over the Kubernetes API.

Allocate is told only device IDs (device plugin API), so the plugin lists this node's pods that carry an
assignment and have not been allocated yet (the Aliyun/HAMi pattern), and marks the one it serves. The
assignment is read with the extender's own model (`tessera.api.assignment`), so both sides agree on the JSON.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.alias_generators import to_camel
from tessera.api import contract
from tessera.api.assignment import Assignment, AssignmentError
from tessera.api.quantity import QuantityError, resource_quantity
from tessera.api.safe_load import load_json_file, validated
from tessera.kube import KubeClient, default_config

log = logging.getLogger(__name__)
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class NodePod:
    namespace: str
    name: str
    uid: str
    created: str  # RFC 3339 creationTimestamp; orders candidates oldest first
    gpu_requests: tuple[int, ...]  # tessera.io/gpu per container that asks for it
    assignment: Assignment | None
    allocated: bool = False
    assignment_error: str | None = None
    allocated_ids: tuple[str, ...] = ()  # the device IDs Allocate served this pod with (tessera.io/allocated)
    deleting: bool = False  # metadata.deletionTimestamp is set: the kubelet will not admit it any more
    workload: str = ""  # tessera.io/workload, "<kind>[:<class>]"
    priority_class: str = ""  # spec.priorityClassName
    checkpoints: bool = False  # tessera.io/checkpoints == "true"
    phase: str = ""  # status.phase
    p99_dedicated_s: float | None = None  # tessera.io/p99-dedicated-seconds: the HP lane's p99 alone

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        """Its containers have all stopped for good (Succeeded or Failed): it holds no GPU any more,
        though the pod object stays until deleted."""
        return self.phase in FINISHED_PHASES


class PodSource(Protocol):
    async def pods_on_node(self, node: str) -> list[NodePod]: ...

    async def mark_allocated(self, pod: NodePod, device_ids: list[str]) -> None: ...

    async def annotate(self, pod: NodePod, annotations: dict[str, str]) -> None:
        """Merge `annotations` into the pod's (e.g. `tessera.io/progress`)."""
        ...


def pod_info_from_manifest(pod: dict[str, Any]) -> NodePod:
    """Read the fields the agent needs from a v1.Pod as JSON (camelCase, as the API server sends it)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    where = f"pod {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    assignment, error = None, None
    raw = annotations.get(contract.ANN_ASSIGNMENT)
    if raw is not None:
        try:
            assignment = Assignment.parse(raw, where=where)
        except AssignmentError as err:
            error = str(err)
    requests = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(contract.RESOURCE_GPU) or (
            resources.get("requests") or {}
        ).get(contract.RESOURCE_GPU)
        if value is not None:
            try:
                requests.append(resource_quantity(contract.RESOURCE_GPU, value))
            except QuantityError as err:  # this pod cannot be served; the others on the node still can
                log.warning("%s: %s", where, err)
    return NodePod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        created=str(meta.get("creationTimestamp") or ""),
        gpu_requests=tuple(requests),
        assignment=assignment,
        allocated=contract.ANN_ALLOCATED in annotations,
        assignment_error=error,
        allocated_ids=tuple(d for d in str(annotations.get(contract.ANN_ALLOCATED, "")).split(",") if d),
        deleting=bool(meta.get("deletionTimestamp")),
        workload=str(annotations.get(contract.ANN_WORKLOAD, "")),
        priority_class=str((pod.get("spec") or {}).get("priorityClassName") or ""),
        checkpoints=str(annotations.get(contract.ANN_CHECKPOINTS, "")).lower() == "true",
        phase=str((pod.get("status") or {}).get("phase") or ""),
        p99_dedicated_s=_seconds(annotations.get(contract.ANN_P99_DEDICATED), where),
    )


def _seconds(raw: object, where: str) -> float | None:
    """A positive number of seconds, or None (absent, or bad: logged, and the loop measures instead)."""
    if raw is None:
        return None
    try:
        value = float(str(raw).strip())
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    log.warning(
        "%s: %s must be a positive number of seconds, got %r; ignored", where, contract.ANN_P99_DEDICATED, raw
    )
    return None


class _PodPart(BaseModel):
    """A part of a v1.Pod: the fields the agent reads are typed; the rest of Kubernetes' schema, which the
    agent neither reads nor owns, is let through (a manifest copied from a cluster is accepted whole)."""

    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=True)


class _PodMetadata(_PodPart):
    name: str = Field(min_length=1)
    namespace: str = "default"
    uid: str = Field(min_length=1)  # how the peer check finds a socket's pod, from its cgroup
    creation_timestamp: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)


class _ContainerResources(_PodPart):
    limits: dict[str, str | int | float] = Field(default_factory=dict)
    requests: dict[str, str | int | float] = Field(default_factory=dict)


class _PodContainer(_PodPart):
    resources: _ContainerResources = _ContainerResources()


class _PodSpec(_PodPart):
    containers: list[_PodContainer] = Field(default_factory=list)
    priority_class_name: str = ""
    node_name: str = ""


class _PodStatus(_PodPart):
    phase: str = ""


class PodManifest(_PodPart):
    """A pod as `--fake-pods` gives it: a v1.Pod's JSON, checked before the agent reads it."""

    metadata: _PodMetadata
    spec: _PodSpec = _PodSpec()
    status: _PodStatus = _PodStatus()


class PodManifests(RootModel[list[PodManifest]]):
    """The `--fake-pods` file: a JSON list of pod manifests."""


def load_pod_manifests(path: Path) -> list[NodePod]:
    """The pods of a JSON list of pod manifests; InputError naming the file and the first bad field."""
    manifests = validated(PodManifests, load_json_file(path), str(path)).root
    return [pod_info_from_manifest(m.model_dump(by_alias=True)) for m in manifests]


class KubernetesPodSource(PodSource):
    """Pods from the API server through Tessera's client (`tessera.kube`); credentials from the in-cluster
    service account, else the default kubeconfig."""

    def __init__(self, api: KubeClient | None = None) -> None:
        self._api = api if api is not None else KubeClient(default_config())

    @property
    def api(self) -> KubeClient:
        """The client it uses (the node patcher, BE restarter and event sink share it)."""
        return self._api

    async def pods_on_node(self, node: str) -> list[NodePod]:
        items = (await self._api.list_pods(field_selector=f"spec.nodeName={node}")).get("items") or []
        # the field selector is the server's job; checking again keeps a server that ignores it
        # (or a stale cache in between) from handing this node another node's pods
        return [pod_info_from_manifest(p) for p in items if (p.get("spec") or {}).get("nodeName") == node]

    async def mark_allocated(self, pod: NodePod, device_ids: list[str]) -> None:
        await self.annotate(pod, {contract.ANN_ALLOCATED: ",".join(device_ids)})

    async def annotate(self, pod: NodePod, annotations: dict[str, str]) -> None:
        await self._api.patch_pod_annotations(pod.namespace, pod.name, annotations)


@dataclass
class StaticPodSource(PodSource):
    """Pods held in memory: for `tessera-agent --fake-gpus` demos and tests without an API server."""

    pods: list[NodePod] = field(default_factory=list)
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)  # pod UID → annotations written

    async def pods_on_node(self, node: str) -> list[NodePod]:
        return [p for p in self.pods if p.assignment is None or p.assignment.node == node]

    async def mark_allocated(self, pod: NodePod, device_ids: list[str]) -> None:
        self.pods = [
            replace(p, allocated=True, allocated_ids=tuple(device_ids)) if p.uid == pod.uid else p
            for p in self.pods
        ]
        await self.annotate(pod, {contract.ANN_ALLOCATED: ",".join(device_ids)})

    async def annotate(self, pod: NodePod, annotations: dict[str, str]) -> None:
        self.annotations.setdefault(pod.uid, {}).update(annotations)
