"""What the extender reads from ResourceClaims (`lanes.api: dra`, docs/dra.md "Packing through DRA").

A pod asking for a lane through a claim carries no extended resource: its request is in the claim, which
exists before the pod is scheduled (named by the pod, or made from its template by the resource claim
controller, which records the name in `status.resourceClaimStatuses`; kube-scheduler waits for it). The
extender reads the claim's requests of DeviceClass `gpu.tessera.io` to score nodes by Tessera's rule, and the
allocation results of every claim to know what each GPU has left. Which devices a claim gets stays the
structured allocator's choice; nothing here writes a claim.

Requests are read as the allocator charges them: a capacity not requested takes the device's default, all of
it (a whole GPU); a request between two valid values is rounded up (whole MiB, whole percent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from tessera.api import contract

JsonObj = dict[str, Any]
MIB = 1 << 20
DEVICE_PREFIX = "gpu-"  # the agent names each GPU's device gpu-<index>
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True)
class ClaimRequest:
    """A pod's GPUs through claims: `gpus` lanes of the same size (memory None: all of a GPU's memory)."""

    gpus: int
    compute_percent: int
    memory_mib: int | None


@dataclass(frozen=True)
class ClaimShare:
    """One allocation result of this driver: the share a claim holds of one GPU."""

    node: str
    gpu_index: int
    memory_mib: int | None  # None: no consumed capacity recorded, the whole GPU
    compute_percent: int


class ClaimReadError(ValueError):
    """A claim the extender cannot score a pod by, with the reason."""


def _amount(value: object, what: str) -> Decimal:
    try:
        parsed = parse_quantity(value)  # type: ignore[no-untyped-call]  # the client ships no annotations
    except (ValueError, TypeError):
        raise ClaimReadError(f"{what} {value!r} is not a quantity") from None
    if not isinstance(parsed, Decimal) or not parsed.is_finite() or parsed <= 0:
        raise ClaimReadError(f"{what} {value!r} must be a finite amount above 0")
    return parsed


def _percent(value: object, what: str) -> int:
    pct = math.ceil(_amount(value, what))
    if pct > 100:
        raise ClaimReadError(f"{what} {value!r} is more than 100 %")
    return pct


def _mib(value: object, what: str) -> int:
    return math.ceil(_amount(value, what) / MIB)


def _request(req: JsonObj, where: str) -> ClaimRequest | None:
    """One entry of spec.devices.requests: None when it asks another DeviceClass."""
    if "firstAvailable" in req:
        classes = {(s or {}).get("deviceClassName") for s in req.get("firstAvailable") or []}
        if contract.DRA_DEVICE_CLASS in classes:
            raise ClaimReadError(f"{where} is a prioritized list (firstAvailable): its size is not fixed")
        return None
    exact = req.get("exactly")
    if not isinstance(exact, dict):
        raise ClaimReadError(f"{where} has neither exactly nor firstAvailable")
    if exact.get("deviceClassName") != contract.DRA_DEVICE_CLASS:
        return None
    if exact.get("adminAccess"):
        raise ClaimReadError(f"{where} asks for admin access (an observer holds no lane)")
    if exact.get("selectors"):
        raise ClaimReadError(f"{where} has selectors: the devices it may take are its own choice")
    mode = exact.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise ClaimReadError(f"{where} has allocationMode {mode}: how many GPUs it takes depends on the node")
    count = exact.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ClaimReadError(f"{where} has count {count!r}, not a whole number of at least 1")
    asked = (exact.get("capacity") or {}).get("requests") or {}
    if not isinstance(asked, dict):
        raise ClaimReadError(f"{where} has capacity.requests that is not a map")
    memory = asked.get(contract.DRA_CAPACITY_MEMORY)
    compute = asked.get(contract.DRA_CAPACITY_COMPUTE)
    return ClaimRequest(
        count,
        100 if compute is None else _percent(compute, f"{where}: {contract.DRA_CAPACITY_COMPUTE}"),
        None if memory is None else _mib(memory, f"{where}: {contract.DRA_CAPACITY_MEMORY}"),
    )


def claim_request(claim: JsonObj) -> ClaimRequest | None:
    """The GPUs a claim asks of DeviceClass `gpu.tessera.io`, None when it asks none; ClaimReadError when it
    asks in a way that has no one size to score (prioritized lists, selectors, lanes of different sizes…)."""
    meta = claim.get("metadata") or {}
    name = f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    devices = ((claim.get("spec") or {}).get("devices")) or {}
    requests = devices.get("requests") or []
    if not isinstance(requests, list):
        raise ClaimReadError(f"{name}: spec.devices.requests is not a list")
    found = [
        r
        for i, req in enumerate(requests)
        if (r := _request(req if isinstance(req, dict) else {}, f"{name} request {i}")) is not None
    ]
    return combine(found, name)


def combine(found: list[ClaimRequest], where: str) -> ClaimRequest | None:
    """Several requests (or claims) of one size as one request of their GPUs together."""
    if not found:
        return None
    sizes = {(r.compute_percent, r.memory_mib) for r in found}
    if len(sizes) > 1:
        raise ClaimReadError(f"{where} asks for lanes of different sizes")
    return ClaimRequest(sum(r.gpus for r in found), found[0].compute_percent, found[0].memory_mib)


def pod_claim_names(pod: JsonObj) -> list[str]:
    """The names of the claims the pod uses, in its namespace; ClaimReadError for a claim from a template
    that the resource claim controller has not made yet (kube-scheduler waits for it too)."""
    spec = pod.get("spec") or {}
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, dict)
    }
    names = []
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, dict):
            continue
        if entry.get("resourceClaimName"):
            names.append(str(entry["resourceClaimName"]))
        elif entry.get("resourceClaimTemplateName"):
            claim = made.get(entry.get("name"))
            if not claim:
                raise ClaimReadError(f"the claim for {entry.get('name')!r} is not made from its template yet")
            names.append(str(claim))
    return names


def uses_claims(pod: JsonObj) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def claim_shares(claim: JsonObj) -> list[ClaimShare]:
    """What an allocated claim holds of this driver's GPUs (none for a claim not allocated); results with
    admin access hold nothing (the allocator counts none). ClaimReadError for a result it cannot read."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        if not isinstance(r, dict) or r.get("driver") != contract.DRA_DRIVER or r.get("adminAccess"):
            continue
        device = str(r.get("device") or "")
        index = device.removeprefix(DEVICE_PREFIX)
        if not device.startswith(DEVICE_PREFIX) or not index.isdigit():
            raise ClaimReadError(f"allocated device {device!r} is not one the agent publishes (gpu-<index>)")
        consumed = r.get("consumedCapacity") or {}
        memory = consumed.get(contract.DRA_CAPACITY_MEMORY)
        compute = consumed.get(contract.DRA_CAPACITY_COMPUTE)
        out.append(
            ClaimShare(
                str(r.get("pool") or ""),
                int(index),
                None if memory is None else _mib(memory, f"{device}: consumed memory"),
                100 if compute is None else _percent(compute, f"{device}: consumed computeShare"),
            )
        )
    return out


def is_extended_resource_claim(claim: JsonObj) -> bool:
    """A claim kube-scheduler made for a pod asking `tessera.io/gpu` (its pod's assignment counts it)."""
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    return ann.get(EXTENDED_RESOURCE_CLAIM) == "true"


def extended_claim_name(pod: JsonObj) -> str:
    """The claim kube-scheduler made for the pod's extended resources (KEP-5004), as its PreBind recorded it in
    `status.extendedResourceClaimStatus`; ClaimReadError when none is recorded yet."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName") if isinstance(status, dict) else None
    if not name:
        raise ClaimReadError("no claim for its tessera.io/gpu is recorded in its status yet")
    return str(name)


def claimed_gpus(claim: JsonObj, pod_uid: str, node: str) -> list[int]:
    """The GPUs (indices, in result order) an extended-resource claim was allocated for the pod on `node`:
    whole GPUs of this driver, as kube-scheduler's PreBind wrote them. ClaimReadError with the reason when the
    claim is not that (not yet allocated or reserved for the pod, another node's, a share of a GPU)."""
    meta = claim.get("metadata") or {}
    name = f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    if not is_extended_resource_claim(claim):
        raise ClaimReadError(f"{name} is not one kube-scheduler made for extended resources")
    if meta.get("deletionTimestamp"):
        raise ClaimReadError(f"{name} is being deleted")
    status = claim.get("status") or {}
    if not status.get("allocation"):
        raise ClaimReadError(f"{name} is not allocated yet")
    if pod_uid not in {str((r or {}).get("uid")) for r in status.get("reservedFor") or []}:
        raise ClaimReadError(f"{name} is not reserved for the pod")
    try:
        shares = claim_shares(claim)
    except ClaimReadError as err:
        raise ClaimReadError(f"{name}: {err}") from None
    if not shares:
        raise ClaimReadError(f"{name} holds no device of {contract.DRA_DRIVER}")
    out: list[int] = []
    for share in shares:
        device = f"{DEVICE_PREFIX}{share.gpu_index}"
        if share.node != node:
            raise ClaimReadError(f"{name} holds {device} of node {share.node!r}, not of {node}")
        if share.compute_percent != 100 or share.gpu_index in out:
            raise ClaimReadError(f"{name} holds a share of {device}, not the whole GPU")
        out.append(share.gpu_index)
    return out
