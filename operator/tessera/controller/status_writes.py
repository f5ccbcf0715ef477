"""When the arbiter re-writes an App's status: only when something a reader acts on changed.

Every App arrival starts a round, and each round refreshes every App's ρ; writing each App whose ρ moved
at all made N arrivals cost ~N² status patches. An App's status is written when its leases, phase, GPUs,
jobs, finish time, conditions or observed generation change, when ρ moves by more than a relative tolerance from the value last written,
or when the last write is older than a maximum staleness (so elapsed time and GPU-seconds stay fresh).

A round leaves out Apps whose leases it only renewed: the arbiter's ledger holds their new expiries
(controller/ledger.py) and their statuses follow with the age-only refreshes. For those (`lagging`) a later
expiry of the same leases, and ρ, are no reason to write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api.base import wire_name

# Fields that change every round by construction; they ride along with writes due for other reasons.
# Wire names from the model's own spelling (a hand-written "activeGpuSeconds" never matched the wire's
# activeGPUSeconds, so every App holding GPUs was re-written by every round).
VOLATILE = tuple(wire_name(f) for f in ("rho", "elapsed_seconds", "active_gpu_seconds", "updated_at"))


@dataclass(frozen=True, slots=True)
class Written:
    """What was last written for one App: the non-volatile fields, ρ, and when."""

    fields: dict[str, Any]
    rho: float | None
    at: float


def stable_fields(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k not in VOLATILE}


def rho_moved(old: float | None, new: float | None, tolerance: float) -> bool:
    """True when ρ appeared, disappeared or moved by more than `tolerance` relative to the old value."""
    if old is None or new is None:
        return old is not new
    if old == new:
        return False
    scale = max(abs(old), 1e-12)
    return abs(new - old) / scale > tolerance


def status_due(
    last: Written | None,
    status: Mapping[str, Any],
    now: float,
    *,
    rho_tolerance: float,
    max_staleness_s: float,
    lagging: bool = False,
) -> bool:
    """Whether `status` (wire form) should be written at `now`. `lagging`: the App's lease expiries are
    held by the ledger, so neither they nor ρ make the write due (its other fields and age still do)."""
    if last is None:
        return True
    fields = stable_fields(status)
    if lagging:
        if without_expiries(fields) != without_expiries(last.fields):
            return True
        return now - last.at >= max_staleness_s
    if fields != last.fields:
        return True
    rho = status.get("rho")
    if rho_moved(last.rho, float(rho) if rho is not None else None, rho_tolerance):
        return True
    return now - last.at >= max_staleness_s


def without_expiries(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields with each lease's expiry and source left out (what a renewal changes: the same GPUs may
    come back through the auction or as leftovers)."""
    leases = fields.get("leases")
    if not leases:
        return dict(fields)
    drop = ("expiresAt", "source")
    return {**fields, "leases": [{k: v for k, v in le.items() if k not in drop} for le in leases]}


def written(status: Mapping[str, Any], now: float) -> Written:
    rho = status.get("rho")
    value = float(rho) if rho is not None and math.isfinite(float(rho)) else None
    return Written(stable_fields(status), value, now)
