"""GPUs an object claims in what the API server holds: an App's leases (status), a TrialGroup's pool
(annotation), a ModelDeployment's replicas (status groups).

A starting operator (a restart, or a standby taking over) loads each object when its handler first runs,
and the first handlers run rounds before the others have loaded. Until an object is loaded its claims come
from these, read from kopf indices that kopf fills before it runs any handler, so no round hands out GPUs
that an object not yet loaded holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api import contract
from tessera.controller.apps import to_time
from tessera.controller.trialgroups import parse_pool
from tessera.controller.view import gpu_id


@dataclass(frozen=True, slots=True)
class Claim:
    """GPUs one object (by uid) holds, each until an epoch time (None: until released)."""

    uid: str
    gpus: tuple[tuple[str, float | None], ...]

    def live(self, now: float) -> set[str]:
        return {g for g, until in self.gpus if until is None or until > now}


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid", ""))


def app_claim(body: Mapping[str, Any]) -> Claim:
    """The GPUs of the App's leases, each until its expiry."""
    gpus: list[tuple[str, float | None]] = []
    for lease in (body.get("status") or {}).get("leases") or []:
        expires = to_time(lease.get("expiresAt"))
        node = lease.get("node")
        if expires is None or not node:
            continue
        gpus.extend((gpu_id(str(node), int(i)), expires) for i in lease.get("gpuIndices") or [])
    return Claim(_uid(body), tuple(gpus))


def trialgroup_claim(body: Mapping[str, Any]) -> Claim:
    """The group's GPU pool, while the group still runs."""
    if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return Claim(_uid(body), ())
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return Claim(_uid(body), tuple((g, None) for g in parse_pool(annotations.get(contract.ANN_GPU_POOL))))


def deployment_claim(body: Mapping[str, Any]) -> Claim:
    """The GPUs of the deployment's replicas (status groups, "node/i,node/j" each)."""
    groups = (body.get("status") or {}).get("groups") or []
    gpus = [g for group in groups for g in str(group).split(",") if "/" in g]
    return Claim(_uid(body), tuple((g, None) for g in gpus))


def unloaded(
    claims: Mapping[tuple[str, str], Iterable[Claim]], loaded: Mapping[tuple[str, str], str], now: float
) -> set[str]:
    """GPUs claimed by objects not in `loaded` ((namespace, name) → uid of the object loaded)."""
    out: set[str] = set()
    for key, values in claims.items():
        for claim in values:
            if loaded.get(key) != claim.uid:
                out |= claim.live(now)
    return out
