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
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tessera.controller.pools import PoolMember, drained_groups, plan_pool, workload
from tessera.controller.serving_stats import Counters
from tessera.gateway.demo_models import early_exit_model
from tessera.gateway.worker import ModelledCost, OnnxModel, Worker, make_worker_app

from .gateway_harness import _tessera, free_port, stop, wait_ready
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
        async with session.get(f"{url}/metrics") as r:
            metrics = await r.text()
    return {"met": met, "total": total, "outputs": outputs, "stats": stats, "metrics": metrics}


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
    # Observed attainment per model: what the operator's stats reader takes from /stats, and the metric.
    for m in ("a", "b"):
        c = Counters.parse(pooled["stats"], m)
        assert c.met == pooled["met"][m] and c.met + c.missed + c.dropped == pooled["total"][m]
        samples = {
            s.labels["outcome"]: s.value
            for fam in text_string_to_metric_families(pooled["metrics"])
            if fam.name == "tessera_serving_requests"
            for s in fam.samples
            if s.name == "tessera_serving_requests_total" and s.labels.get("modeldeployment") == m
        }
        assert samples["slo_met"] == c.met and samples["dropped"] == c.dropped
    # The pipelined group's answers equal the unsplit model's.
    unsplit = OnnxModel(model_path, name="a")
    want = unsplit.run({"x": pooled["x"], "n": np.array([[LAYERS]], dtype=np.int64)})[0]
    for m in ("a", "b"):
        np.testing.assert_array_equal(np.asarray(pooled["outputs"][m], dtype=np.float32), want.ravel())
    pa, da = attainment(pooled), attainment(dedicated)
    print(f"SLO attainment: pooled {pa:.3f} (planner {plan.attainment:.3f}), dedicated {da:.3f}")
    assert pa > da


def test_switching_plans_mid_load_loses_no_request(model_path: Path, tmp_path: Path) -> None:
    """Re-placement on the data plane: the gateway follows its configuration file; mid-run the plan moves
    from dedicated groups to one pooled pipeline. Requests in flight on the old groups are answered, new
    ones go to the new group, the old groups drain and leave the gateway's group table."""
    x = np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)
    path = tmp_path / "gateway.json"
    with stack() as s:

        async def start_worker(pp: int, models: list[str]) -> str:
            ms = [OnnxModel(model_path, name=m, cost=COST, stages=pp, layers=LAYERS) for m in models]
            runner, url = await _serve(make_worker_app(Worker(*ms)))
            s.workers[url] = runner
            return url

        old = [s.run(lambda m=m: start_worker(1, [m])) for m in ("a", "b")]  # type: ignore[misc]
        new = s.run(lambda: start_worker(2, ["a", "b"]))

        def config(groups: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "port": 0,
                "pool": {
                    "name": "p",
                    "models": [{"name": m, "slo_s": 1.0} for m in ("a", "b")],
                    "groups": groups,
                    "reload_from": str(path),
                    "reload_interval_s": 0.05,
                },
            }

        before = config(
            [
                {"id": "g0", "worker": old[0], "pp": 1, "models": {"a": [L_S]}},
                {"id": "g1", "worker": old[1], "pp": 1, "models": {"b": [L_S]}},
            ]
        )
        after = config(
            [{"id": "g2", "worker": new, "pp": 2, "models": {"a": [L_S / 2] * 2, "b": [L_S / 2] * 2}}]
        )
        path.write_text(json.dumps(before))
        url = s.start_gateway(before)

        checks: list[set[str]] = []

        async def go() -> tuple[list[tuple[int, str]], dict[str, Any], dict[str, Any], dict[str, Any]]:
            answers: list[tuple[int, str]] = []
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

                async def one(model: str) -> None:
                    async with session.post(f"{url}/v2/models/{model}/infer", json=request(x, model)) as r:
                        body = await r.json()
                        answers.append((r.status, str(body.get("reason", ""))))

                async def stats() -> dict[str, Any]:
                    async with session.get(f"{url}/stats") as r:
                        return dict(await r.json())

                loop = asyncio.get_running_loop()
                tasks = []
                for i in range(40):  # 20 req/s for 2 s; the switch lands at 1 s with requests in flight
                    tasks.append(asyncio.create_task(one("ab"[i % 2])))
                    if i == 20:  # a burst queues 0.3 s of work on g0, then the plan switches
                        tasks += [asyncio.create_task(one("a")) for _ in range(8)]
                        await asyncio.sleep(0.01)
                        mid = await stats()
                        path.write_text(json.dumps(after))
                        while "g2" not in (during := await stats())["pool_groups"]:
                            await asyncio.sleep(0.01)
                        # The operator's drain check on the live gateway: g0 still has the burst in
                        # flight, so it is not drained yet.
                        checks.append(await drained_groups(url, {"g0", "g1"}))
                    await asyncio.sleep(0.05)
                await asyncio.gather(*tasks)
                deadline = loop.time() + 20
                while True:
                    end = await stats()
                    if set(end["pool_groups"]) == {"g2"} or loop.time() > deadline:
                        break
                    await asyncio.sleep(0.05)
                checks.append(await drained_groups(url, {"g0", "g1"}))
                checks.append(await drained_groups(url, {"g2"}))  # routed: never drained
                checks.append(
                    await drained_groups("http://127.0.0.1:9", {"g0"})
                )  # unreadable: timeout decides
            return answers, mid, during, end

        answers, mid, during, end = s.run(go)
    assert len(answers) == 48
    # Every request answered: served, or refused at once by the admission check — none cut off.
    assert all(st == 200 or (st == 503 and reason == "cannot-meet-slo") for st, reason in answers), answers
    assert sum(st == 200 for st, _ in answers) >= 36
    assert set(mid["pool_groups"]) == {"g0", "g1"}
    # Switched with the burst still running on g0: out of routing, draining, not cut off.
    assert during["pool_groups"]["g0"]["routing"] is False and during["pool_groups"]["g0"]["inflight"] > 0
    assert end["pool_groups"] == {"g2": {"routing": True, "inflight": 0, "healthy": True}}
    # What the operator's drain check (tessera.controller.pools.drained_groups) made of those /stats.
    assert "g0" not in checks[0]
    assert checks[1:] == [{"g0", "g1"}, set(), set()], checks
    assert end["models"]["a"]["groups"].get("g2", 0) > 0 and end["models"]["a"]["groups"].get("g0", 0) > 0
    assert "g1" not in end["models"]["a"]["groups"] and "g0" not in end["models"]["b"]["groups"]


def test_tessera_worker_serves_a_pool_group_as_pipeline_stages(model_path: Path, tmp_path: Path) -> None:
    """The command a pool worker pod runs: `tessera worker --names $(TESSERA_MODEL) --model-dir DIR
    --stages $(TESSERA_PIPELINE_STAGES)` serves every model of its group, split into stages, with the
    unsplit model's answers."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.onnx").write_bytes(model_path.read_bytes())
    port = free_port()
    args = ["worker", "--names", "a,b", "--model-dir", str(tmp_path), "--stages", "2", "--port", str(port)]
    proc = subprocess.Popen(_tessera(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    x = np.random.default_rng(1).standard_normal((1, 32)).astype(np.float32)
    want = OnnxModel(model_path, name="u").run({"x": x, "n": np.array([[LAYERS]], dtype=np.int64)})[0]
    try:
        wait_ready(url, proc)
        for name in ("a", "b"):
            req = urllib.request.Request(
                f"{url}/v2/models/{name}/infer",
                data=json.dumps(request(x, name)).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=10) as r:
                got = json.loads(r.read())["outputs"][0]["data"]
            np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), want.ravel())
    finally:
        stop(proc)
