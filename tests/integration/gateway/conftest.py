"""Fixtures for the loopback gateway tests: the demo model and its calibration on a live worker."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tessera.gateway.calibrate import calibrate
from tessera.gateway.demo_models import early_exit_model

from .gateway_harness import MODEL, PACE, payloads, worker_process


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return early_exit_model(tmp_path_factory.mktemp("model") / "early_exit.onnx", width=512)


@pytest.fixture(scope="session")
def app_payloads() -> dict[str, list[dict[str, Any]]]:
    return {"short": payloads("short", 24, seed=1), "long": payloads("long", 24, seed=2)}


@pytest.fixture(scope="session")
def calibration(demo_model: Path, app_payloads: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Priors and the batching model measured on a worker, as the operator would before serving."""
    with worker_process(demo_model, pace=PACE) as (url, _):
        cal = asyncio.run(calibrate(url, MODEL, app_payloads, batch_sizes=(1, 2, 4, 8), batches_per_size=6))
    return cal.as_config()


@pytest.fixture(scope="session")
def two_workers(demo_model: Path) -> Iterator[list[str]]:
    with worker_process(demo_model, pace=PACE) as (a, _), worker_process(demo_model, pace=PACE) as (b, _):
        yield [a, b]
