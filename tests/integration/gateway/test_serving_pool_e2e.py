"""AlpaServe on loopback: two models sharing a pool against the same two on dedicated GPUs.

Real gateway (the pool router: shortest queue, §3.1 admission) and real workers (ONNX Runtime, the
early-exit demo model, its run padded to a modelled 40 ms so the shared CPU's noise does not decide the
outcome). Memory allows one unsplit model per GPU, as in the paper's §3.1 case study. Pooled: the
planner's placement for the two models on the two GPUs they bring — one 2-stage pipeline holding both,
each stage a session padded to its 20 ms share. Dedicated: each model alone on its GPU. The same seeded
Gamma arrivals (CV 3, 6 req/s per model, 10 s) and a 120 ms (3×) SLO drive both.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from tessera.controller.pools import PoolMember, plan_pool, workload
from tessera.gateway.demo_models import early_exit_model
from tessera.gateway.worker import ModelledCost, OnnxModel, Worker, make_worker_app

from .inproc import _serve, stack

MIB = float(1 << 20)
L_S, SLO_S, RATE, CV, SECONDS = 0.04, 0.12, 6.0, 3.0, 10.0
LAYERS = 8
COST = ModelledCost(input="n", unit_s=L_S / LAYERS)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return early_exit_model(tmp_path_factory.mktemp("pool") / "m.onnx", width=32, max_layers=64)


def members() -> list[PoolMember]:
    return [PoolMember(m, m, RATE, CV, SLO_S, L_S, 3000 * MIB, 1, 4096 * MIB) for m in ("a", "b")]


def request(x: np.ndarray, model: str) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [LAYERS]},
        ]
    }


async def drive(url: str, arrivals: list[tuple[float, str]], x: np.ndarray) -> dict[str, Any]:
    """Send every request at its arrival time; count answers within SLO per model."""
    met = {"a": 0, "b": 0}
    total = {"a": 0, "b": 0}
    outputs: dict[str, list[float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.2

        async def one(at: float, model: str) -> None:
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            total[model] += 1
            async with session.post(f"{url}/v2/models/{model}/infer", json=request(x, model)) as r:
                body = await r.read()
                if r.status == 200 and r.headers.get("x-tessera-slo") == "met":
                    met[model] += 1
                    outputs.setdefault(model, json.loads(body)["outputs"][0]["data"])

        await asyncio.gather(*(one(at, m) for at, m in arrivals))
        async with session.get(f"{url}/stats") as r:
            stats = await r.json()
    return {"met": met, "total": total, "outputs": outputs, "stats": stats}


def run_placement(
    model_path: Path, groups: list[tuple[int, dict[str, list[float]]]], arrivals: list[tuple[float, str]]
) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)
    with stack() as s:

        async def start_worker(pp: int, models: list[str]) -> str:
            ms = [OnnxModel(model_path, name=m, cost=COST, stages=pp, layers=LAYERS) for m in models]
            runner, url = await _serve(make_worker_app(Worker(*ms)))
            s.workers[url] = runner
            return url

        pool_groups = []
        for i, (pp, stages) in enumerate(groups):
            url = s.run(lambda pp=pp, stages=stages: start_worker(pp, sorted(stages)))
            pool_groups.append({"id": f"g{i}", "worker": url, "pp": pp, "models": stages})
        config = {
            "port": 0,
            "pool": {
                "name": "p",
                "models": [{"name": m, "slo_s": SLO_S} for m in ("a", "b")],
                "groups": pool_groups,
            },
        }
        url = s.start_gateway(config)
        out = s.run(lambda: drive(url, arrivals, x))
    out["x"] = x
    return out


def attainment(r: dict[str, Any]) -> float:
    return sum(r["met"].values()) / sum(r["total"].values())


def test_pooled_pipeline_beats_dedicated_gpus_under_bursts(model_path: Path) -> None:
    ms = members()
    plan = plan_pool("p", ms, devices_per_node=2)
    # The planner's placement, as the operator computes it: both models on one 2-stage pipeline.
    assert [(g.pp, g.models) for g in plan.groups] == [(2, ("a", "b"))]
    w = workload(ms, seed=7)
    w = w.window(0.0, SECONDS)
    arrivals = [(float(t), w.model_names[i]) for t, i in zip(w.arrivals, w.models, strict=True)]
    assert len(arrivals) > 60
    pooled = run_placement(model_path, [(g.pp, plan.stage_latency_s[g.id]) for g in plan.groups], arrivals)
    dedicated = run_placement(model_path, [(1, {"a": [L_S]}), (1, {"b": [L_S]})], arrivals)

    # Routed only to groups holding the model (dedicated: a → g0, b → g1), and every request counted.
    assert set(dedicated["stats"]["models"]["a"]["groups"]) <= {"g0"}
    assert set(dedicated["stats"]["models"]["b"]["groups"]) <= {"g1"}
    for r in (pooled, dedicated):
        for m in ("a", "b"):
            counts = r["stats"]["models"][m]["requests"]
            assert sum(counts.values()) == r["total"][m]
    # The pipelined group's answers equal the unsplit model's.
    unsplit = OnnxModel(model_path, name="a")
    want = unsplit.run({"x": pooled["x"], "n": np.array([[LAYERS]], dtype=np.int64)})[0]
    for m in ("a", "b"):
        np.testing.assert_array_equal(np.asarray(pooled["outputs"][m], dtype=np.float32), want.ravel())
    pa, da = attainment(pooled), attainment(dedicated)
    print(f"SLO attainment: pooled {pa:.3f} (planner {plan.attainment:.3f}), dedicated {da:.3f}")
    assert pa > da
