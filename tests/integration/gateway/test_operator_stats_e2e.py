"""The operator (kopf, against kmock) reads a real `tessera gateway` process in front of a real `tessera
worker` on loopback: the goodput, attainment and idleness it measures from the gateway's counters appear in
the ModelDeployment's status and scale the replicas past what spec.traffic.expectedRps asks; a gateway that
cannot be read is a condition and an event, and the replicas go back to expectedRps.

Worked numbers: ℓ(b) = 200, 300, 400 ms at b = 1, 2, 4 and a 1 s SLO: the best batch that leaves half the
SLO for queueing is b = 4 at 4 / 0.4 s = 10 rps per replica. expectedRps 1 → 1 replica; ~25 rps offered →
⌈25 / 10⌉ = 3 (at least 2 on a loaded machine that sends fewer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from tessera.api import contract

from tests.integration.operator.conftest import (  # noqa: F401  (api: the kmock fixture)
    MDS,
    NS,
    add_node,
    api,
    events,
    running_operator,
    status_of,
    wait_for,
)

from .gateway_harness import MODEL, PACE, gateway_process, payloads, worker_process

pytestmark = pytest.mark.slow

RATE = 25.0  # requests/s offered


def md_body() -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": NS, "uid": "uid-m", "resourceVersion": "1"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}},
            "model": {"name": MODEL, "dynamic": False},
            "slo": {"latencyMs": 1000},
            "traffic": {"expectedRps": 1},
            "batching": {
                "supportedBatchSizes": [1, 2, 4],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [200, 300, 400]},
            },
            "placement": {"maxGPUs": 4},
        },
    }


def stats_condition(k: kmock.KubernetesEmulator) -> dict[str, Any]:
    conds = status_of(k, MDS, "m").get("conditions") or []
    return next((c for c in conds if c.get("type") == "GatewayStats"), {})


async def offer_load(url: str, stop: asyncio.Event) -> dict[int, int]:
    """Short requests at RATE per second, each on its own (no waiting for answers); answers by status."""
    bodies = payloads("short", 50, seed=3)
    codes: dict[int, int] = {}

    async def one(session: aiohttp.ClientSession, body: dict[str, Any]) -> None:
        async with session.post(f"{url}/v2/models/{MODEL}/infer", json=body) as resp:
            await resp.read()
            codes[resp.status] = codes.get(resp.status, 0) + 1

    async with aiohttp.ClientSession() as session:
        tasks: set[asyncio.Task[None]] = set()
        i = 0
        while not stop.is_set():
            t = asyncio.create_task(one(session, bodies[i % len(bodies)]))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(1 / RATE)  # pacing of the offered load, not a wait for a condition
        await asyncio.gather(*tasks, return_exceptions=True)
    return codes


async def test_gateway_counters_become_status_and_scale_replicas(
    api: kmock.KubernetesEmulator,  # noqa: F811  (the fixture imported above)
    demo_model: Path,
    tmp_path: Path,
) -> None:
    add_node(api, "n1", 4)
    where = {"url": "http://127.0.0.1:1"}  # nothing listens there yet
    async with running_operator(
        api, serving_stats_interval_s=0.5, gateway_url=lambda ns, name: where["url"]
    ) as ctl:
        await wait_for(lambda: len(ctl.view.nodes) == 1, what="the node in the view")
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments", json=md_body()
        )
        # No gateway to read: a condition and an event, and the replicas follow expectedRps.
        await wait_for(lambda: stats_condition(api).get("reason") == "Unreachable", what="Unreachable")
        await wait_for(lambda: events(api, "GatewayStatsUnavailable"), what="the event")
        st = status_of(api, MDS, "m")
        assert st["replicas"] == 1 and "goodputRps" not in st
        assert "127.0.0.1:1" in stats_condition(api)["message"]

        # The gateway the operator configured, its workers on loopback instead of the pods' DNS names.
        config = json.loads(dict(api.objects["v1/configmaps", NS, "m-gateway"])["data"]["gateway.json"])
        assert config["grpc_port"] == 8001
        config.pop("grpc_port")  # loopback: no fixed port another test may hold
        with contextlib.ExitStack() as procs:
            worker, _ = await asyncio.to_thread(procs.enter_context, worker_process(demo_model, pace=PACE))
            config["models"][0]["workers"] = [worker]
            config["health_interval_s"] = 0.2
            gw, _ = await asyncio.to_thread(procs.enter_context, gateway_process(config, tmp_path))
            where["url"] = gw
            stop = asyncio.Event()
            load = asyncio.create_task(offer_load(gw, stop))
            try:
                st = await wait_for(
                    lambda: (
                        (s := status_of(api, MDS, "m")).get("replicas", 0) >= 2
                        and (s.get("statsRequests") or 0) > 0
                        and s
                    ),
                    timeout=90,
                    what="replicas scaled by the measured load",
                )
            finally:
                stop.set()
                codes = await load
            assert codes.get(200, 0) > 0, codes
            # The rate the client reaches depends on the machine's load; that it moved replicas is the point.
            assert st["goodputRps"] > 0 and st["observedLoadRps"] > 0, st
            assert 0 < st["sloAttainmentPercent"] <= 100 and 0 <= st["gpuIdlePercent"] <= 100, st
            assert st["statsWindowSeconds"] >= 0.5, st
            cond = stats_condition(api)
            assert cond["status"] == "True" and cond["reason"] == "Measured", cond
            assert any(
                "rps per replica" in e["message"] or "advice" in e["message"] for e in events(api, "Scaled")
            )

        # The gateway is gone: the figures are cleared and the replicas go back to expectedRps.
        st = await wait_for(
            lambda: (s := status_of(api, MDS, "m")).get("replicas") == 1 and "goodputRps" not in s and s,
            timeout=60,
            what="back to expectedRps",
        )
        assert stats_condition(api)["reason"] == "Unreachable"
