"""Usage gauges recounted once per burst of pod events, not once per event (controller/usage.py)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import generate_latest
from tessera.api import contract
from tessera.controller.metrics import operator_metrics
from tessera.controller.usage import UsageMetrics
from tessera.controller.view import PodInfo


def test_a_burst_of_pod_events_is_recounted_once_with_the_latest_pods() -> None:
    usage = UsageMetrics(operator_metrics(), delay_s=0.05)
    pods: list[PodInfo] = []
    recounts = 0

    def view() -> list[PodInfo]:
        nonlocal recounts
        recounts += 1
        return pods

    async def burst() -> str:
        for i in range(500):  # a round creating 500 pods: one event each
            pods.append(PodInfo("ml", f"p{i}", {contract.LABEL_APP: "a"}, None, (), "Pending", False))
            usage.update_soon(view)
        deadline = time.monotonic() + 60
        while recounts == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return generate_latest(usage.metrics.registry).decode()

    text = asyncio.run(burst())
    assert recounts == 1
    assert 'tessera_pending_pods{namespace="ml",workload="training"} 500.0' in text
