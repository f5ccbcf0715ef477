"""When an App's status is re-written (controller/status_writes.py): structural changes always, ρ only
beyond the relative tolerance, everything once the last write is older than the staleness bound."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.controller.config import OperatorConfig
from tessera.controller.status_writes import rho_moved, status_due, written

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
