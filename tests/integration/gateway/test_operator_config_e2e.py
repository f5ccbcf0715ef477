"""The config the operator writes for a data-dependent ModelDeployment, served by a real gateway in front
of a real `tessera worker` on loopback: the gateway runs Orloj, tags requests by the header the spec names,
and learns each application's solo-time distribution from the times the worker measures, starting from
the spec's (deliberately wrong) priors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from tessera.api.resources import parse_modeldeployment
from tessera.controller.serving import ServingRecord
from tessera.gateway.config import GatewayConfig
from tessera.gateway.server import Gateway, make_gateway_app
from tessera.policy.serving.orloj import OrlojScheduler

from .gateway_harness import MODEL, PACE, worker_process

pytestmark = pytest.mark.slow

SEED_MS = 1.0  # the spec's prior: 1 ms, far below the worker's ~20 ms (short) and ~80 ms (long) solo times


def operator_config(worker: str) -> dict[str, Any]:
    body = {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "w", "image": "w:1"}]}},
            "model": {"name": MODEL, "dynamic": True},
            "slo": {"latencyMs": 2000},
            "batching": {"supportedBatchSizes": [1, 2, 4]},
            "applications": [
                {"id": "short", "prior": {"samplesMs": [SEED_MS]}},
                {"id": "long", "prior": {"samplesMs": [SEED_MS]}},
            ],
            "frontend": {"appIdHeader": "X-Tenant", "defaultApp": "short"},
            "profiler": {
                "sampleRate": 1.0,
                "maxGPUSharePercent": 100,
                "minSamplesPerApp": 3,
                "pickupIntervalSeconds": 0.05,
            },
        },
    }
    rec = ServingRecord("ml", "m", "u", parse_modeldeployment(body).spec, body, gpus=[["n1/0"]])
    config = rec.gateway_config()
    config["models"][0]["workers"] = [worker]  # loopback instead of the worker pod's DNS name
    config["health_interval_s"] = 0.2
    return config


def test_operator_config_serves_with_orloj_tags_by_header_and_learns_from_the_worker(
    demo_model: Path, app_payloads: dict[str, list[dict[str, Any]]]
) -> None:
    with worker_process(demo_model, pace=PACE) as (worker, _):
        asyncio.run(_serve(operator_config(worker), app_payloads))


async def _serve(config: dict[str, Any], app_payloads: dict[str, list[dict[str, Any]]]) -> None:
    cfg = GatewayConfig.parse(config)
    assert cfg.models[0].policy == "orloj" and cfg.models[0].app_header == "x-tenant"
    gateway = Gateway(cfg)
    server = TestServer(make_gateway_app(gateway))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            url = str(server.make_url(f"/v2/models/{MODEL}/infer"))
            deadline = asyncio.get_running_loop().time() + 60
            while not gateway.services[MODEL].ready:
                assert asyncio.get_running_loop().time() < deadline, "the worker never became ready"
                await asyncio.sleep(0.05)
            sched = gateway.services[MODEL].scheduler
            assert isinstance(sched, OrlojScheduler)
            sent = {"short": 0, "long": 0}
            for app in ("short", "long"):
                for body in app_payloads[app][:8]:
                    async with session.post(url, json=body, headers={"X-Tenant": app}) as resp:
                        assert resp.status == 200, await resp.text()
                    sent[app] += 1
            assert {a: sched._app_counts[a] for a in sent} == sent  # tagged by the configured header
            # Solo times the worker measured replace the 1 ms seed once the profiler has picked them up.
            learned: dict[str, float] = {}
            while True:
                now = asyncio.get_running_loop().time()
                snaps = {a: sched.apps[a].snapshot(now) for a in sent}
                learned = {a: h.mean() * 1000 for a, h in snaps.items() if h is not None}
                if len(learned) == 2 and min(learned.values()) > 5 * SEED_MS:
                    break
                assert now < deadline, f"Orloj did not learn from the worker: {learned} ms"
                async with session.post(url, json=app_payloads["long"][0], headers={"X-Tenant": "long"}):
                    pass
            assert learned["long"] > learned["short"], learned
    finally:
        await server.close()
        await gateway.close()
