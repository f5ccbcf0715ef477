"""DRA mode (`tessera operator --lanes-api dra`): the GPUs the operator chose, as claims that kube-scheduler's
DRA allocator can satisfy in one way only.

Themis leases, Fluid plans and AlpaServe groups name a node and GPU indices (`PodPlan`). With the device plugin
the extender honours them; with DRA the cluster's scheduler allocates, so each pod gets a ResourceClaimTemplate
(named as the pod, with the pod's owners) of one request per chosen GPU:

    exactly: {deviceClassName: gpu.tessera.io,
              selectors: [cel: device.attributes["gpu.tessera.io"].uuid == "<that GPU's UUID>"],
              capacity: {requests: {memory: <lane>Mi, computeShare: "<lane %>"}}}   (none: the whole GPU)

and a required node affinity on `metadata.name` (the scheduler's Filter then tries that node only). The
allocator still does all accounting (consumed capacity, share IDs, what fits), so a lane that does not fit
leaves the pod Pending with the scheduler's reason instead of double-booking the GPU. The claim made from the
template belongs to the pod (the resource claim controller deletes it when the pod ends); the template goes
with the pod when the operator deletes it, and with its owner otherwise (garbage collection).

Why not write `status.allocation` ourselves (docs/dra.md): the API server checks no capacity, so a second
allocator beside kube-scheduler's could hand out the same share, and kube-scheduler's PostFilter deallocates an
allocated, unreserved claim that keeps a pod from fitting; the selectors survive both.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tessera.api import contract
from tessera.controller.kube import Kind
from tessera.controller.view import ClusterView

JsonObj = dict[str, Any]

RESOURCE_CLAIM_TEMPLATES = Kind("resource.k8s.io", "v1", "resourceclaimtemplates")
CLAIM = "tessera-lanes"  # the pod's name for its claim (spec.resourceClaims[].name, containers' claims)


class LanesError(ValueError):
    """A plan the claims cannot express (a GPU whose UUID the cluster view does not hold); the message says
    which, and goes into the owner's event like any failed pod create."""


def uuid_selector(uuid: str) -> str:
    """CEL selecting the one device with this UUID (json.dumps quotes it as a CEL string literal)."""
    return f'device.attributes["{contract.DRA_DRIVER}"].{contract.DRA_ATTRIBUTE_UUID} == {json.dumps(uuid)}'


def claim_requests(
    uuids: Sequence[tuple[int, str]], memory_mib: int | None, compute_percent: int | None
) -> list[JsonObj]:
    """One request per (index, UUID), in the plan's GPU order (the order of CUDA_VISIBLE_DEVICES)."""
    capacity: dict[str, str] = {}
    if memory_mib is not None:
        capacity[contract.DRA_CAPACITY_MEMORY] = f"{memory_mib}Mi"
    if compute_percent is not None:
        capacity[contract.DRA_CAPACITY_COMPUTE] = str(compute_percent)
    out = []
    for index, uuid in uuids:
        exactly: JsonObj = {
            "deviceClassName": contract.DRA_DEVICE_CLASS,
            "selectors": [{"cel": {"expression": uuid_selector(uuid)}}],
        }
        if capacity:
            exactly["capacity"] = {"requests": dict(capacity)}
        out.append({"name": f"gpu-{index}", "exactly": exactly})
    return out


def claim_template(name: str, namespace: str, meta: Mapping[str, Any], requests: list[JsonObj]) -> JsonObj:
    """The ResourceClaimTemplate `name`; `meta` gives its labels and ownerReferences (the pod's)."""
    return {
        "apiVersion": f"{RESOURCE_CLAIM_TEMPLATES.group}/{RESOURCE_CLAIM_TEMPLATES.version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(meta.get("labels") or {}),
            "ownerReferences": copy.deepcopy(list(meta.get("ownerReferences") or [])),
        },
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def attach_claim(spec: JsonObj, template_name: str, node: str) -> None:
    """Give a pod spec (in place) the claim from `template_name` for its first container, and pin it to
    `node` by a required node affinity on the node's name (added to every term the template has: terms are
    ORed, and each must keep the pin)."""
    spec["resourceClaims"] = [
        *(c for c in spec.get("resourceClaims") or [] if c.get("name") != CLAIM),
        {"name": CLAIM, "resourceClaimTemplateName": template_name},
    ]
    containers = spec.get("containers") or []
    if containers:
        main = containers[0]
        res = dict(main.get("resources") or {})
        res["claims"] = [*(c for c in res.get("claims") or [] if c.get("name") != CLAIM), {"name": CLAIM}]
        main["resources"] = res
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), pin]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity


class DraLanes:
    """Turns a plan's node and GPU indices into the UUIDs its claim selects, from the cluster view (the node
    agent's `tessera.io/gpus` inventory)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def uuids(self, node: str, indices: Sequence[int]) -> list[tuple[int, str]]:
        info = self.view.nodes.get(node)
        if info is None:
            raise LanesError(f"node {node} publishes no GPU inventory ({contract.ANN_NODE_GPUS})")
        by_index = {g.index: g.uuid for g in info.gpus}
        missing = [i for i in indices if i not in by_index]
        if missing:
            raise LanesError(f"node {node} has no GPU with index {', '.join(map(str, missing))}")
        return [(i, by_index[i]) for i in indices]
