"""Worker pod manifests from a workload's PodTemplateSpec.

Every pod the operator writes: `tessera.io/placement` (node + GPU indices decided by an auction or a plan),
`tessera.io/workload`, the managed-by/owner labels, TESSERA_* env, the toleration of the GPU-node taint (chart
value gpuNodes.reserve) and an owner reference so Kubernetes' garbage collector removes it with its owner.
Its lane, by the lanes API in use:
  devicePlugin  schedulerName tessera-scheduler (the extender honours the placement) and `tessera.io/gpu`
                (+ memory/compute for a lane) on the first container
  dra           the claim of a ResourceClaimTemplate named as the pod, whose requests select the placed GPUs
                (`dra.py`), and a node affinity to the placed node; any DRA scheduler (the template's
                schedulerName, else the default one)
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from tessera.api import contract
from tessera.api.placement import PlacementAnnotation
from tessera.controller.dra import attach_claim
from tessera.controller.view import group_by_node

JsonObj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Owner:
    """The custom resource a pod belongs to (for ownerReferences and labels)."""

    kind: str
    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Owner:
        meta = body.get("metadata") or {}
        return cls(str(body.get("kind")), str(meta["name"]), str(meta.get("namespace", "")), str(meta["uid"]))

    def body(self) -> JsonObj:
        """The owner as far as events and owner references need it."""
        return {
            "apiVersion": contract.API_VERSION,
            "kind": self.kind,
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }

    def reference(self) -> JsonObj:
        """The owner reference kopf builds (controller, blockOwnerDeletion): Kubernetes' garbage collector
        deletes the dependent with its owner, and foreground deletion of the owner waits for it."""
        return dict(kopf.build_owner_reference(kopf.Body(cast(kopf.RawBody, self.body()))))


@dataclass(frozen=True, slots=True)
class PodPlan:
    """One pod to run: where, with how much GPU, and its identity inside the workload."""

    node: str
    gpu_indices: tuple[int, ...]
    labels: Mapping[str, str]
    env: Mapping[str, str]
    workload: str
    memory_mib: int | None = None  # lane size per GPU; None = whole GPUs
    compute_percent: int | None = None
    base: str = ""  # name stem; the pod name adds a digest of everything above
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def placement(self) -> PlacementAnnotation:
        return PlacementAnnotation(node=self.node, gpu_indices=list(self.gpu_indices))

    @property
    def name(self) -> str:
        """Deterministic: the same plan always names the same pod, so a repeated reconcile creates
        nothing new (the API answers 409), and a changed plan gets a new pod next to the old one."""
        key = json.dumps(
            [self.node, self.gpu_indices, sorted(self.env.items()), self.memory_mib, self.compute_percent],
            separators=(",", ":"),
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        stem = self.base[: 63 - 9].rstrip("-")
        return f"{stem}-{digest}"


def gang_plans(
    gpus: Sequence[str],
    *,
    base: str,
    labels: Mapping[str, str],
    env: Mapping[str, str],
    workload: str,
    memory_mib: int | None = None,
    compute_percent: int | None = None,
) -> list[PodPlan]:
    """The pods of one gang (a job's or a trial's GPUs): one per node, ranked in node order, each a
    worker with its rank and the gang's world size."""
    nodes = group_by_node(gpus)
    return [
        PodPlan(
            node=node,
            gpu_indices=tuple(idx),
            labels={**labels, contract.LABEL_ROLE: "worker"},
            env={**env, contract.ENV_RANK: str(rank), contract.ENV_WORLD_SIZE: str(len(nodes))},
            workload=workload,
            memory_mib=memory_mib,
            compute_percent=compute_percent,
            base=f"{base}-{rank}",
        )
        for rank, (node, idx) in enumerate(nodes.items())
    ]


def _env_list(existing: Sequence[Mapping[str, Any]], extra: Mapping[str, str]) -> list[JsonObj]:
    kept = [dict(e) for e in existing if e.get("name") not in extra]
    return kept + [{"name": k, "value": v} for k, v in extra.items()]


def build_pod(
    template: Mapping[str, Any],
    plan: PodPlan,
    owner: Owner,
    workload_class: str,
    socket_group: int = 0,
    *,
    dra: bool = False,
) -> JsonObj:
    """The Pod manifest for `plan`, from a PodTemplateSpec (dict as in the custom resource). With a
    `socket_group` the pod's processes get that supplemental group: the node agent's progress and lane
    sockets are mode 0660 in it. `dra`: its lane is the claim of the ResourceClaimTemplate named as the pod
    (`dra.claim_template`), not extended resources for the extender."""
    tmpl = copy.deepcopy(dict(template))
    meta: JsonObj = dict(tmpl.get("metadata") or {})
    spec: JsonObj = dict(tmpl.get("spec") or {})
    labels = {
        **(meta.get("labels") or {}),
        **plan.labels,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
    }
    annotations = {
        **(meta.get("annotations") or {}),
        **plan.annotations,
        contract.ANN_PLACEMENT: plan.placement.to_annotation(),
        contract.ANN_WORKLOAD: f"{plan.workload}:{workload_class}",
    }
    limits = {contract.RESOURCE_GPU: str(len(plan.gpu_indices))}
    if plan.memory_mib is not None:
        limits[contract.RESOURCE_GPU_MEMORY] = str(plan.memory_mib)
    if plan.compute_percent is not None:
        limits[contract.RESOURCE_GPU_COMPUTE] = str(plan.compute_percent)
    containers = []
    for i, c in enumerate(spec.get("containers") or []):
        c = dict(c)
        c["env"] = _env_list(c.get("env") or [], plan.env)
        if i == 0 and not dra:  # the GPU belongs to the main container; sidecars get none
            res = dict(c.get("resources") or {})
            res["limits"] = {**(res.get("limits") or {}), **limits}
            res["requests"] = {**(res.get("requests") or {}), **limits}
            c["resources"] = res
        containers.append(c)
    spec["containers"] = containers
    if socket_group:
        security = dict(spec.get("securityContext") or {})
        groups = list(security.get("supplementalGroups") or [])
        if socket_group not in groups:
            security["supplementalGroups"] = [*groups, socket_group]
        spec["securityContext"] = security
    if dra:
        attach_claim(spec, plan.name, plan.node)
    else:
        spec["schedulerName"] = contract.SCHEDULER_NAME
    # GPU nodes may be kept for tessera-scheduler's pods (chart value gpuNodes.reserve); tolerating a taint
    # that is absent changes nothing, so the operator's pods always carry the toleration (with DRA lanes too:
    # their node affinity pins them to the placed node, which may be reserved).
    spec["tolerations"] = _with_toleration(spec.get("tolerations") or [], contract.gpu_node_toleration())
    spec.setdefault("restartPolicy", "Never")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "namespace": owner.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner.reference()],
        },
        "spec": spec,
    }


def _with_toleration(tolerations: Sequence[Mapping[str, Any]], toleration: dict[str, str]) -> list[JsonObj]:
    """The template's tolerations with `toleration` added unless it is there already."""
    out = [dict(t) for t in tolerations]
    return out if toleration in out else [*out, toleration]


def template_errors(template: Mapping[str, Any] | None, where: str) -> list[tuple[str, str]]:
    """What a template lacks before pods can be built from it (the API server would reject the pods)."""
    if not template:
        return [(where, "a pod template is required")]
    containers = (template.get("spec") or {}).get("containers") or []
    if not containers:
        return [(f"{where}.spec.containers", "must have at least 1 container")]
    return []
