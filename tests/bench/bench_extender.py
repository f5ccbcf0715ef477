"""Filter + prioritize latency (p50/p99) at 100, 1,000 and 5,000 nodes of 8 GPUs, half-filled, seeded.

Each cycle is a new pod (own UID, one of several request shapes) sent as kube-scheduler sends it
(ExtenderArgs with NodeNames, nodeCacheCapable: every node, i.e. percentageOfNodesToScore 100), filter then
prioritize; the pod is then held on the best-scored node, as bind would, so the view changes between cycles.

- in-process: the handlers called directly; baseline: a fit-only filter with no index (each GPU checked
  with why_not, nothing scored) — what any extender must at least do without the per-node summaries.
- HTTP: an aiohttp client against the extender serving on 127.0.0.1 in a separate process (what
  kube-scheduler waits for); baseline: the same server answering with a fit-only echo (all nodes pass,
  score 0), i.e. the floor of HTTP + JSON for that many node names.

Pods come in a few request shapes, as replicas and gangs do, so the per-node memo of choose_gpus answers most
nodes; `--unique` gives every pod its own memory size, so every node is scored afresh (the worst case).
The view is frozen out of the garbage collector after it is built, as the server does after its first sync.

The extender scores plain GPU pods with FGD's rule (policy.lanes.packing, as `tessera extender` runs it);
`--legacy` measures the weighted binpack/fragmentation scorer instead. Each size runs with repeated request
shapes and with a new shape per pod (`--shapes repeated|unseen|both`, default both).

Run: .venv/bin/python tests/bench/bench_extender.py [--calls N] [--sizes 100,1000,5000] [--shapes both] [--legacy]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.extender.server import Extender, make_app
from tessera.extender.view import Holding, SchedulerCache, pod_request
from tessera.policy.lanes.packing import PackingConfig
from tessera.policy.lanes.placement import Tenant, why_not
from tessera.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.ports
from tests.ports import free_port

CPU: dict[int, list[float]] = {}  # in-process CPU ms per cycle: the cost without the other tenants' load
SHAPES = [("1", "2000", "10"), ("1", "6000", "30"), ("1", "9000", "60"), ("2", "16000", "100")]


def cluster(n: int, rng: random.Random) -> SchedulerCache:
    view = SchedulerCache()
    for k in range(n):
        name = f"node-{k}"
        inv = [GpuInfo(uuid=f"{name}-{i}", index=i, memory_mib=16000) for i in range(8)]
        view.apply_node(
            {"metadata": {"name": name, "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)}}}
        )
        for i in range(8):
            if rng.random() < 0.5:
                tenant = Tenant(rng.choice([4000, 8000]), 40, rng.random())
                view.hold(f"{name}-{i}", Holding(name, (i,), "g-l1", tenant))
    return view


WARM = len(SHAPES)  # warm-up cycles (not measured): the first pod of a shape scores every node afresh
UNIQUE = False  # --unique: every pod asks for a different memory size, so no per-node memo entry is reused
LEGACY = False  # --legacy: the weighted scorer instead of FGD's rule


def extender(n: int) -> Extender:
    return Extender(None, cluster(n, random.Random(n)), packing=None if LEGACY else PackingConfig())


def pod(i: int) -> dict[str, Any]:
    gpus, mem, comp = SHAPES[i % len(SHAPES)]
    limits = {
        contract.RESOURCE_GPU: gpus,
        contract.RESOURCE_GPU_MEMORY: str(int(mem) - i % 1000) if UNIQUE else mem,
        contract.RESOURCE_GPU_COMPUTE: comp,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p{i}",
            "namespace": "default",
            "uid": f"uid-{i}",
            "resourceVersion": str(1000 + i),
            "annotations": {contract.ANN_PROFILE: "compute" if i % 2 else "memory"},
        },
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


def args_for(i: int, names: list[str]) -> dict[str, Any]:
    return {"Pod": pod(i), "Nodes": None, "NodeNames": names}


def settle(view: SchedulerCache, i: int, scores: list[dict[str, Any]], ext: Extender) -> None:
    """Hold cycle i's pod on its best node, as a bind would."""
    best = max(scores, key=lambda h: h["Score"])
    if best["Score"] == 0:
        return
    choice = ext.evaluate(pod(i), best["Host"])
    req = pod_request(pod(i), 16000)
    if req is not None and not isinstance(choice, str):
        view.hold(f"uid-{i}", Holding(best["Host"], choice.gpu_indices, "g-l9", req.as_tenant()))


def in_process(n: int, calls: int, progress: Progress) -> tuple[list[float], list[float]]:
    ext = extender(n)
    gc.collect()
    gc.freeze()
    names = list(ext.view.nodes)
    for i in range(calls, calls + WARM):  # warm-up as over HTTP: one full cycle per request shape
        ext.filter(args_for(i, names))
        ext.prioritize(args_for(i, names))
    ours, base = [], []
    for i in range(calls):
        args = args_for(i, names)
        ext.view.apply_pod(args["Pod"])  # the watch's ADDED event comes before the scheduling cycle
        t0, c0 = time.perf_counter(), time.thread_time()
        ext.filter(args)
        scores = ext.prioritize(args)
        ours.append((time.perf_counter() - t0) * 1e3)
        CPU.setdefault(n, []).append((time.thread_time() - c0) * 1e3)
        settle(ext.view, i, scores, ext)
        progress.update(progress.done + 1, f"{n} nodes in-process")
    for i in range(calls):
        args = args_for(i, names)
        t0 = time.perf_counter()
        req = pod_request(args["Pod"], 16000)
        assert req is not None
        [
            m
            for m in args["NodeNames"]
            if sum(why_not(g, req, ext.config) is None for g in ext.view.nodes[m]) >= req.gpus
        ]
        base.append((time.perf_counter() - t0) * 1e3)
        progress.update(progress.done + 1, f"{n} nodes fit-only")
    return ours, base


def serve(n: int, port: int, echo: bool) -> None:
    """Child process: the extender (or the echo floor) on 127.0.0.1:port."""
    if echo:

        async def f(request: web.Request) -> web.Response:
            body = orjson.loads(await request.read())
            out = {
                "Nodes": None,
                "NodeNames": body["NodeNames"],
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
            return web.Response(body=orjson.dumps(out), content_type="application/json")

        async def p(request: web.Request) -> web.Response:
            body = orjson.loads(await request.read())
            scores = [{"Host": h, "Score": 0} for h in body["NodeNames"]]
            return web.Response(body=orjson.dumps(scores), content_type="application/json")

        app = web.Application()
        app.router.add_post("/filter", f)
        app.router.add_post("/prioritize", p)
    else:
        app = make_app(extender(n))
        gc.collect()
        gc.freeze()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def over_http(n: int, calls: int, echo: bool, progress: Progress) -> list[float]:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(n), str(port), "echo" if echo else "tessera"]
        + (["--shapes", "unseen"] if UNIQUE else [])
        + (["--legacy"] if LEGACY else [])
    )
    names = [f"node-{k}" for k in range(n)]
    out: list[float] = []
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    async with http.get(f"{url}/healthz" if not echo else f"{url}/x"):
                        break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            for i in range(-WARM, calls):  # warm-up: opens the connection, one full cycle per request shape
                body = orjson.dumps(args_for(i, names))
                t0 = time.perf_counter()
                async with http.post(
                    f"{url}/filter", data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    filtered = orjson.loads(await r.read())
                body = orjson.dumps({"Pod": pod(i), "Nodes": None, "NodeNames": filtered["NodeNames"]})
                async with http.post(
                    f"{url}/prioritize", data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()
                if i >= 0:
                    out.append((time.perf_counter() - t0) * 1e3)
                    progress.update(progress.done + 1, f"{n} nodes HTTP {'echo' if echo else 'tessera'}")
    finally:
        child.terminate()
        child.wait()
    return out


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--shapes", choices=("repeated", "unseen", "both"), default="both")
    parser.add_argument("--legacy", action="store_true", help="the weighted scorer instead of FGD's rule")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    a = parser.parse_args()
    global UNIQUE, LEGACY
    LEGACY = a.legacy
    if a.serve:
        UNIQUE = a.shapes == "unseen"
        serve(int(a.serve[0]), int(a.serve[1]), a.serve[2] == "echo")
        return
    sizes = [int(s) for s in a.sizes.split(",")]
    modes = {"repeated": [False], "unseen": [True], "both": [False, True]}[a.shapes]
    for unique in modes:
        UNIQUE = unique
        CPU.clear()
        report(sizes, a.calls, unique)


def report(sizes: list[int], calls: int, unique: bool) -> None:
    rows = []
    load = [os.getloadavg()[0]]
    with Progress(len(sizes) * calls * 4, "extender", enabled=True) as progress:
        for n in sizes:
            ours, base = in_process(n, calls, progress)
            http_ours = asyncio.run(over_http(n, calls, False, progress))
            http_base = asyncio.run(over_http(n, calls, True, progress))
            rows.append((n, base, ours, http_base, http_ours))
            load.append(os.getloadavg()[0])
    shapes = "a new request shape per pod (unseen)" if unique else f"{len(SHAPES)} request shapes (repeated)"
    scorer = "weighted scorer (--legacy)" if LEGACY else "FGD's rule"
    print(f"\nfilter + prioritize per pod, ms ({calls} pods per size, {shapes}, {scorer}; p50 / p99)")
    print(f"load average (1 min) at start and after each size: {', '.join(f'{x:.1f}' for x in load)}")
    print(
        f"{'nodes':>6} | {'fit-only':>15} | {'tessera':>15} {'ratio':>6} | {'HTTP echo':>15} | {'HTTP tessera':>15} {'ratio':>6} | {'µs/node':>7}"
    )
    for n, base, ours, hb, ho in rows:

        def cell(v: list[float]) -> str:
            return f"{statistics.median(v):>6.2f} / {pct(v, 0.99):>6.2f}"

        print(
            f"{n:>6} | {cell(base)} | {cell(ours)} {pct(ours, 0.99) / pct(base, 0.99):>6.2f} | "
            f"{cell(hb)} | {cell(ho)} {pct(ho, 0.99) / pct(hb, 0.99):>6.2f} | {1e3 * statistics.median(ho) / n:>7.2f}"
        )
    print("\nin-process CPU time per pod (thread_time, unaffected by other processes), ms p50 / p99:")
    for n, *_ in rows:
        print(f"{n:>6} | {statistics.median(CPU[n]):>6.2f} / {pct(CPU[n], 0.99):>6.2f}")
    print(
        "\nratio: p99 against the baseline to its left; targets p99 < 20 ms at 1,000 nodes, < 50 ms at 5,000."
    )


if __name__ == "__main__":
    main()
