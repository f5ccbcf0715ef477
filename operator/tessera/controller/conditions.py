"""Status conditions (metav1.Condition shape), the `Ready` condition, and the "invalid object" report.

Each kind keeps its own conditions (App: Admitted; TrialGroup: GPUsAvailable, Planned; ModelDeployment:
Scaled; any kind: Valid=False for a refused spec, and QueueResolved in a namespace with the queue label,
controller/queues.py) and carries `Ready` after them, whose meaning per kind is
documented on the status models (tessera.api). Whoever writes a kind's conditions writes its whole list
(a merge patch replaces lists); `carry` keeps a condition's lastTransitionTime while its status stays the
same, as meta.SetStatusCondition does, so a rewrite with the same status is a no-op for readers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tessera.api.base import READY
from tessera.api.resources import ManifestError

Cond = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Readiness:
    """What the Ready condition says: status, a CamelCase reason and a message stable between passes."""

    ok: bool
    reason: str
    message: str


def stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(tz=UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, ok: bool, reason: str, message: str, *, generation: int | None = None) -> Cond:
    out: Cond = {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp(),
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def generation_of(body: Mapping[str, Any]) -> int | None:
    gen = (body.get("metadata") or {}).get("generation")
    return int(gen) if isinstance(gen, int) else None


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def carry(new: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]] | None) -> list[Cond]:
    """`new` with each condition's lastTransitionTime taken from `previous` when its status is unchanged."""
    out = []
    for cond in new:
        c = dict(cond)
        old = find(previous, str(c.get("type")))
        if old is not None and old.get("status") == c.get("status") and old.get("lastTransitionTime"):
            c["lastTransitionTime"] = old["lastTransitionTime"]
        out.append(c)
    return out


def with_ready(
    conditions: Sequence[Mapping[str, Any]],
    ready: Readiness,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]] | None,
) -> list[Cond]:
    """The kind's own `conditions` (any Ready among them dropped), then Ready; transition times carried
    from `previous` (what the object holds, or what this operator last wrote)."""
    own = [c for c in conditions if c.get("type") != READY]
    new = [*own, condition(READY, ready.ok, ready.reason, ready.message, generation=generation)]
    return carry(new, previous)


def invalid_message(errors: list[tuple[str, str]]) -> str:
    return "; ".join(f"{path or '<root>'}: {msg}" for path, msg in errors)


def invalid_status(
    err: ManifestError | list[tuple[str, str]],
    *,
    generation: int | None = None,
    previous: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Any], str]:
    """(status patch, event message) for an object the operator refuses; no pods are made for it.
    Valid and Ready are False with reason InvalidSpec and every bad field in the message."""
    errors = err.errors if isinstance(err, ManifestError) else err
    msg = invalid_message(errors)
    valid = condition("Valid", False, "InvalidSpec", msg, generation=generation)
    conditions = with_ready([valid], Readiness(False, "InvalidSpec", msg), generation, previous)
    status: dict[str, Any] = {"phase": "Failed", "conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    return status, msg
