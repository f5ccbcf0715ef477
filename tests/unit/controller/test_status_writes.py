"""When an App's status is re-written (controller/status_writes.py): structural changes always, ρ only
beyond the relative tolerance, everything once the last write is older than the staleness bound."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from tessera.api.app import AppStatus
from tessera.controller.apps import record_from_body
from tessera.controller.config import OperatorConfig
from tessera.controller.status_writes import VOLATILE, rho_moved, status_due, written

from tests.unit.controller.test_leases import body, job

T0 = 1_700_000_000.0


def st(rho: float | None = 2.0, gpus: int = 1, elapsed: float = 10.0, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": "Running", "gpus": gpus, "rho": rho, "elapsedSeconds": elapsed}
    out["leases"] = [{"node": "n1", "gpuIndices": [0], "job": "j1"}]
    out.update(extra)
    return out


def due(last_status: dict[str, Any] | None, new: dict[str, Any], dt: float = 1.0, tol: float = 0.05) -> bool:
    last = written(last_status, T0) if last_status is not None else None
    return status_due(last, new, T0 + dt, rho_tolerance=tol, max_staleness_s=600.0)


def test_first_write_is_always_due() -> None:
    assert due(None, st())


def test_unchanged_status_is_not_rewritten_even_as_time_passes() -> None:
    assert not due(st(), st(elapsed=500.0), dt=500.0)


def test_rho_within_tolerance_is_not_rewritten_beyond_it_is() -> None:
    assert not due(st(rho=2.0), st(rho=2.09))  # 4.5 % < 5 %
    assert due(st(rho=2.0), st(rho=2.11))  # 5.5 % > 5 %
    assert due(st(rho=2.0), st(rho=1.89))  # moves down count too


def test_structural_changes_are_written_whatever_rho_does() -> None:
    assert due(st(), st(gpus=2))
    assert due(st(), st(phase="Succeeded"))
    assert due(st(), st(leases=[]))


def test_rho_appearing_or_vanishing_is_a_change() -> None:
    assert due(st(rho=None), st(rho=1.0))
    assert due(st(rho=1.0), st(rho=None))
    assert not rho_moved(None, None, 0.05)


def test_staleness_bound_forces_a_write() -> None:
    assert not due(st(rho=2.0), st(rho=2.01), dt=599.0)
    assert due(st(rho=2.0), st(rho=2.01), dt=600.0)


def test_zero_tolerance_writes_every_rho_move() -> None:
    assert due(st(rho=2.0), st(rho=2.0001), tol=0.0)
    assert not due(st(rho=2.0), st(rho=2.0), tol=0.0)


def test_config_defaults_and_validation() -> None:
    cfg = OperatorConfig(lease_s=120.0)
    assert cfg.status_rho_tolerance == 0.05 and cfg.status_staleness == 120.0
    assert OperatorConfig(status_max_staleness_s=30.0).status_staleness == 30.0
    with pytest.raises(ValueError, match="tolerance"):
        OperatorConfig(status_rho_tolerance=-0.1)
    with pytest.raises(ValueError, match="staleness"):
        OperatorConfig(status_max_staleness_s=0.0)


def test_the_volatile_fields_are_the_wire_names_of_the_status() -> None:
    """GPU-seconds grow every round an App holds GPUs: they ride along, never make a write due. The list
    once spelled activeGpuSeconds while the wire says activeGPUSeconds, and every App holding GPUs was
    re-written by every round."""
    wire = AppStatus(rho=1.0, updated_at=datetime(2024, 1, 1, tzinfo=UTC)).to_wire()
    assert set(VOLATILE) <= set(wire)
    before = st(activeGPUSeconds=100.0)
    assert not due(before, st(activeGPUSeconds=160.0))


def test_gpu_seconds_survive_a_restart() -> None:
    """The record read back from a written status carries the App's GPU-seconds (a restart read the
    misspelled activeGpuSeconds and started every App's attained service from 0)."""
    raw = body([job("j", 1)], status=AppStatus(active_gpu_seconds=1234.5).to_wire())
    assert record_from_body(raw, T0).active_gpu_seconds == 1234.5


def test_an_app_behind_the_ledger_is_due_for_what_a_renewal_does_not_change() -> None:
    """A renewed App's new expiries are in the arbiter's ledger: a later expiry of the same lease, and ρ,
    leave it to the refresher (age); anything else a reader acts on is written at once."""

    def leases(expires: str, gpus: list[int] | None = None) -> list[dict[str, Any]]:
        return [{"node": "n1", "gpuIndices": gpus or [0], "job": "j1", "expiresAt": expires}]

    def lagging_due(new: dict[str, Any], dt: float = 1.0) -> bool:
        last = written(st(leases=leases("2023-11-14T22:15:00Z")), T0)
        return status_due(last, new, T0 + dt, rho_tolerance=0.05, max_staleness_s=600.0, lagging=True)

    renewed = leases("2023-11-14T22:25:00Z")
    assert not lagging_due(st(leases=renewed))
    assert not lagging_due(st(rho=4.0, leases=renewed))
    assert lagging_due(st(leases=renewed), dt=600.0)  # by age, as every status
    assert lagging_due(st(leases=leases("2023-11-14T22:25:00Z", [1])))  # the lease moved
    assert lagging_due(st(gpus=2, leases=renewed))
    assert lagging_due(st(phase="Succeeded", leases=renewed))
    # Not behind the ledger: a new expiry is a change like any other.
    assert due(st(leases=leases("2023-11-14T22:15:00Z")), st(leases=renewed))
