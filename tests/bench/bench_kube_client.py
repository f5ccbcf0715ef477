"""List + watch of every node and pod, as the extender's sync does, with each Kubernetes client candidate.

A real API server (tests/integration/k8s/controlplane.py: etcd + kube-apiserver on loopback) is filled with
N nodes and M pods (created with concurrent requests; pods carry a container with tessera.io/gpu limits and
a few annotations, so they are about the size of a real one). Each candidate then does what
`Extender.sync_forever` does at start: list nodes, list pods, decode both, and open a watch of each. The watch
starts at resourceVersion 0, so the server replays every object as ADDED from its watch cache: the time to
receive all N + M events is the time to carry a full watch stream through the client.

Candidates:
- aiohttp: the extender's hand-written client before the shared module (aiohttp GET, json.loads of the
  body, one json.loads per watch line) — the baseline;
- asyncio-raw / asyncio-models: `kubernetes_asyncio` (CoreV1Api with `_preload_content=False` and the raw
  watch lines, or the generated models and `watch.Watch`);
- tessera.kube: the shared client (`tessera.kube.KubeClient`) the extender now runs on;
- sync-raw / sync-models: `kubernetes` (the same two ways, each call in a worker thread as the agent runs it).

Run: .venv/bin/python tests/bench/bench_kube_client.py [--nodes 5000] [--pods 1000,10000] [--models-pods 10000] [--repeat 1]
Model-decoding candidates are skipped above --models-pods pods (they decode a few hundred pods a second here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.integration.k8s.controlplane import ADMIN_TOKEN, ControlPlane, control_plane  # noqa: E402

NS = "bench"


def node(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "labels": {"kubernetes.io/hostname": f"node-{i:05d}", "tessera.io/gpu-model": "A100"},
            "annotations": {
                "tessera.io/gpus": json.dumps([{"index": g, "memoryMiB": 81920} for g in range(8)])
            },
        },
        "status": {"capacity": {"tessera.io/gpu": "8", "cpu": "64", "memory": "512Gi"}},
    }


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{i:06d}",
            "namespace": NS,
            "labels": {"app": f"app-{i % 500}"},
            "annotations": {"tessera.io/workload": "training", "tessera.io/checkpoints": "true"},
        },
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "command": ["python", "train.py", "--epochs", "10"],
                    "resources": {"limits": {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "16Gi"}},
                }
            ],
        },
    }


async def fill(plane: ControlPlane, nodes: range, pods: range, concurrency: int = 48) -> float:
    """Create the objects with `concurrency` requests in flight; returns the seconds it took."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(
        headers=headers, connector=aiohttp.TCPConnector(limit=concurrency, ssl=ctx)
    ) as s:

        async def post(path: str, body: dict[str, Any]) -> None:
            async with s.post(plane.server + path, json=body) as r:
                if r.status not in (201, 409):
                    raise RuntimeError(f"POST {path}: {r.status} {await r.text()}")

        await post("/api/v1/namespaces", {"metadata": {"name": NS}})
        jobs = [("/api/v1/nodes", node(i)) for i in nodes]
        jobs += [(f"/api/v1/namespaces/{NS}/pods", pod(i)) for i in pods]
        queue = iter(jobs)

        async def worker() -> None:
            for path, body in queue:
                await post(path, body)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


# -- candidates: each returns (list seconds, watch seconds) -----------------------------------------------


async def timed_watch(streams: list[Callable[[], Awaitable[int]]]) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(s() for s in streams))
    return time.perf_counter() - t0


async def bench_aiohttp(plane: ControlPlane, nodes: int, pods: int) -> tuple[float, float]:
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as s:

        async def get(path: str) -> Any:
            async with s.get(plane.server + path, ssl=ctx) as r:
                return json.loads(await r.text())

        t0 = time.perf_counter()
        n, p = await get("/api/v1/nodes"), await get("/api/v1/pods")
        t_list = time.perf_counter() - t0
        assert len(n["items"]) == nodes and len(p["items"]) == pods

        def stream(path: str, want: int) -> Callable[[], Awaitable[int]]:
            async def run() -> int:
                seen = 0
                url = plane.server + path + "?watch=true&resourceVersion=0"
                timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
                async with s.get(url, ssl=ctx, timeout=timeout) as r:
                    async for line in r.content:
                        if line.strip() and json.loads(line)["type"] == "ADDED":
                            seen += 1
                            if seen == want:
                                return seen
                return seen

            return run

        return t_list, await timed_watch([stream("/api/v1/nodes", nodes), stream("/api/v1/pods", pods)])


async def bench_tessera(plane: ControlPlane, nodes: int, pods: int) -> tuple[float, float]:
    from tessera.kube import KubeClient, KubeConfig

    kube = KubeClient(KubeConfig(plane.server, token=ADMIN_TOKEN, ca_file=str(plane.ca_file)))
    try:
        t0 = time.perf_counter()
        n, p = await kube.list_nodes(), await kube.list_pods()
        t_list = time.perf_counter() - t0
        assert len(n["items"]) == nodes and len(p["items"]) == pods

        def stream(path: str, want: int) -> Callable[[], Awaitable[int]]:
            async def run() -> int:
                seen = 0
                async for event in kube.watch(path, "0"):
                    if event["type"] == "ADDED":
                        seen += 1
                        if seen == want:
                            break
                return seen

            return run

        return t_list, await timed_watch([stream("/api/v1/nodes", nodes), stream("/api/v1/pods", pods)])
    finally:
        await kube.close()


async def bench_asyncio(plane: ControlPlane, nodes: int, pods: int, *, models: bool) -> tuple[float, float]:
    from kubernetes_asyncio import client, watch

    cfg = client.Configuration(host=plane.server, api_key={"BearerToken": ADMIN_TOKEN})
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    cfg.ssl_ca_cert = str(plane.ca_file)
    async with client.ApiClient(cfg) as api_client:
        core = client.CoreV1Api(api_client)
        t0 = time.perf_counter()
        if models:
            n, p = await core.list_node(), await core.list_pod_for_all_namespaces()
            assert len(n.items) == nodes and len(p.items) == pods
        else:
            rn = await core.list_node(_preload_content=False)
            rp = await core.list_pod_for_all_namespaces(_preload_content=False)
            n, p = json.loads(await rn.read()), json.loads(await rp.read())
            assert len(n["items"]) == nodes and len(p["items"]) == pods
        t_list = time.perf_counter() - t0

        def stream(func: Any, want: int) -> Callable[[], Awaitable[int]]:
            async def run() -> int:
                seen = 0
                if models:
                    async with watch.Watch().stream(func, resource_version="0", timeout_seconds=600) as w:
                        async for event in w:
                            if event["type"] == "ADDED":
                                seen += 1
                                if seen == want:
                                    return seen
                    return seen
                resp = await func(watch=True, resource_version="0", _preload_content=False)
                try:
                    while line := await resp.content.readline():
                        if line.strip() and json.loads(line)["type"] == "ADDED":
                            seen += 1
                            if seen == want:
                                return seen
                finally:
                    resp.close()
                return seen

            return run

        t_watch = await timed_watch(
            [stream(core.list_node, nodes), stream(core.list_pod_for_all_namespaces, pods)]
        )
    return t_list, t_watch


async def bench_sync(plane: ControlPlane, nodes: int, pods: int, *, models: bool) -> tuple[float, float]:
    from kubernetes import client, watch

    cfg = client.Configuration(host=plane.server, api_key={"authorization": f"Bearer {ADMIN_TOKEN}"})
    cfg.ssl_ca_cert = str(plane.ca_file)
    core = client.CoreV1Api(client.ApiClient(cfg))

    def listing() -> None:
        if models:
            n, p = core.list_node(), core.list_pod_for_all_namespaces()
            assert len(n.items) == nodes and len(p.items) == pods
        else:
            n = json.loads(core.list_node(_preload_content=False).data)
            p = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
            assert len(n["items"]) == nodes and len(p["items"]) == pods

    t0 = time.perf_counter()
    await asyncio.to_thread(listing)
    t_list = time.perf_counter() - t0

    def stream(func: Any, want: int) -> Callable[[], Awaitable[int]]:
        def run() -> int:
            seen = 0
            if models:
                w = watch.Watch()
                for event in w.stream(func, resource_version="0", timeout_seconds=600):
                    if event["type"] == "ADDED":
                        seen += 1
                        if seen == want:
                            w.stop()
                            break
                return seen
            resp = func(watch=True, resource_version="0", _preload_content=False)
            try:
                for line in _lines(resp):
                    if line.strip() and json.loads(line)["type"] == "ADDED":
                        seen += 1
                        if seen == want:
                            break
            finally:
                resp.release_conn()
            return seen

        return lambda: asyncio.to_thread(run)

    t_watch = await timed_watch(
        [stream(core.list_node, nodes), stream(core.list_pod_for_all_namespaces, pods)]
    )
    return t_list, t_watch


def _lines(resp: Any) -> Any:
    """Lines of a urllib3 streaming response (what kubernetes.watch does under its model decoding)."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from lines
    if buf:
        yield buf


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", default="1000,10000", help="pod counts to measure at, ascending")
    ap.add_argument("--models-pods", type=int, default=10000, help="skip model candidates above this")
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the candidates (best total reported)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    nodes, have = args.nodes, 0
    with control_plane() as plane:
        for pods in (int(p) for p in args.pods.split(",")):
            t_fill = await fill(plane, range(nodes if not have else 0), range(have, pods))
            print(f"\n{nodes} nodes + {pods} pods (created in {t_fill:.1f}s)", flush=True)
            have = pods
            candidates: list[tuple[str, Callable[[], Awaitable[tuple[float, float]]]]] = [
                ("aiohttp", lambda pods=pods: bench_aiohttp(plane, nodes, pods)),
                ("tessera.kube", lambda pods=pods: bench_tessera(plane, nodes, pods)),
                ("asyncio-raw", lambda pods=pods: bench_asyncio(plane, nodes, pods, models=False)),
                ("sync-raw", lambda pods=pods: bench_sync(plane, nodes, pods, models=False)),
            ]
            if pods <= args.models_pods:
                candidates += [
                    ("asyncio-models", lambda pods=pods: bench_asyncio(plane, nodes, pods, models=True)),
                    ("sync-models", lambda pods=pods: bench_sync(plane, nodes, pods, models=True)),
                ]
            print(f"{'client':16} {'list s':>8} {'watch s':>8} {'total s':>8}", flush=True)
            totals: dict[str, list[float]] = {}
            for _ in range(args.repeat):  # rounds interleave the candidates, so a busy spell hits them all
                for name, run in candidates:
                    if only and name not in only:
                        continue
                    t_list, t_watch = await run()
                    totals.setdefault(name, []).append(t_list + t_watch)
                    print(f"{name:16} {t_list:8.2f} {t_watch:8.2f} {t_list + t_watch:8.2f}", flush=True)
            if args.repeat > 1:
                print(
                    "best total s: " + ", ".join(f"{n} {min(t):.2f}" for n, t in totals.items()), flush=True
                )


if __name__ == "__main__":
    asyncio.run(main())
