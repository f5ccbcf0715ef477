"""Bounded concurrent API calls (controller/concurrency.py) and the arbiter's clock guard."""

from __future__ import annotations

import asyncio

import kopf
import pytest
from tessera.controller.arbiter import Arbiter
from tessera.controller.concurrency import gather_limited
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context
from tessera.controller.kube import KubeApi
from tessera.controller.metrics import operator_metrics
from tessera.controller.view import ClusterView


def test_at_most_limit_in_flight_results_in_order_and_errors_returned() -> None:
    in_flight = peak = 0

    async def call(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001 * (i % 3))
        in_flight -= 1
        if i == 5:
            raise RuntimeError("boom")
        return i * i

    out = asyncio.run(gather_limited((call(i) for i in range(20)), 4))
    assert peak == 4
    assert [r for i, r in enumerate(out) if i != 5] == [i * i for i in range(20) if i != 5]
    assert isinstance(out[5], RuntimeError)
    with pytest.raises(ValueError, match=">= 1"):
        asyncio.run(gather_limited([], 0))
    with pytest.raises(ValueError, match="api_concurrency"):
        OperatorConfig(api_concurrency=0)


def test_a_caller_with_a_stale_clock_never_runs_a_round_back_in_time() -> None:
    # A handler reads the clock, then waits for the lock while a later round runs: its round must not
    # be dated before that one (N_avg would see time go backwards).
    t0 = 1_700_000_000.0
    config = OperatorConfig(lease_s=600.0, clock=lambda: t0)

    async def run() -> tuple[float, float]:
        api = KubeApi(kopf.ConnectionInfo(server="http://127.0.0.1:9"))
        arbiter = Arbiter(Context(config, ClusterView(), api, operator_metrics(), lambda *_: None))
        await arbiter.run_round(t0 + 601)
        arbiter.dirty = True
        report = await arbiter.maybe_run(t0)
        await api.close()
        assert report is not None
        return report.now, arbiter.last_round

    assert asyncio.run(run()) == (t0 + 601, t0 + 601)
