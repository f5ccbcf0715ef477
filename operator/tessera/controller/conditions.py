"""Status conditions and the "invalid object" report: one condition + one event naming every bad field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tessera.api.resources import ManifestError


def condition(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def invalid_message(errors: list[tuple[str, str]]) -> str:
    return "; ".join(f"{path or '<root>'}: {msg}" for path, msg in errors)


def invalid_status(err: ManifestError | list[tuple[str, str]]) -> tuple[dict[str, Any], str]:
    """(status patch, event message) for an object the operator refuses; no pods are made for it."""
    errors = err.errors if isinstance(err, ManifestError) else err
    msg = invalid_message(errors)
    return {"phase": "Failed", "conditions": [condition("Valid", False, "InvalidSpec", msg)]}, msg
