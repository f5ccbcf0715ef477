"""Node agent costs: Allocate latency through real gRPC, and the lane coordinator's per-iteration overhead.

1. Allocate (p50/p99) over a unix socket against a pod source holding 10, 100 and 1,000 pods on the node
   (all with assignments, one pending per call). Baseline: GetDevicePluginOptions on the same channel, the
   gRPC round-trip floor; the ratio is what choosing the pod and building its env adds.
2. Coordinator: one job running iterations of a fixed body (0, 1 and 10 ms) with `lane.iteration()` (a
   begin/end grant round trip on the unix socket) against the same loop without it.

Run: .venv/bin/python tests/bench/bench_agent.py
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc
from tessera.api import contract
from tessera.progress import Progress
from tessera.sdk import LaneClient
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.plugin import DevicePlugin
from tessera_agent.lanes.coordinator import LaneCoordinator
from tessera_agent.pods import NodePod, StaticPodSource, pod_info_from_manifest
from tessera_agent.proto import api_pb2, api_pb2_grpc

NODE = "node-a"
CALLS = 200
ITERATIONS = 200


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def make_pod(k: int, uuid: str, allocated: bool) -> NodePod:
    a = (
        f'{{"node":"{NODE}","gpuUUIDs":["{uuid}"],"gpuIndices":[0],"laneId":"l{k}",'
        f'"memoryMiB":1024,"computePercent":10}}'
    )
    ann = {contract.ANN_ASSIGNMENT: a}
    if allocated:
        ann[contract.ANN_ALLOCATED] = "x"
    return pod_info_from_manifest(
        {
            "metadata": {
                "name": f"p{k}",
                "namespace": "ml",
                "uid": f"uid-{k}",
                "creationTimestamp": f"2024-01-01T00:00:{k % 60:02d}Z",
                "annotations": ann,
            },
            "spec": {"containers": [{"name": "c", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
        }
    )


async def allocate_latency(n_pods: int, d: Path, progress: Progress) -> tuple[list[float], list[float]]:
    backend = FakeGpuBackend.uniform(8)
    uuid = backend.gpus()[0].uuid
    source = StaticPodSource([make_pod(k, uuid, allocated=True) for k in range(n_pods - 1)])
    plugin = DevicePlugin(
        AgentConfig(node_name=NODE, device_plugin_dir=d, mps_root=d / "mps"), backend, source
    )
    await plugin.serve()
    base: list[float] = []
    ours: list[float] = []
    try:
        async with grpc.aio.insecure_channel(f"unix://{plugin.cfg.plugin_socket}") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            req = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}::0"])]
            )
            for i in range(CALLS):
                t0 = time.perf_counter()
                await stub.GetDevicePluginOptions(api_pb2.Empty())
                base.append((time.perf_counter() - t0) * 1e3)
                # keep n_pods on the node: drop the oldest served pod, add one pending
                source.pods = [*source.pods[1:], make_pod(n_pods + i, uuid, allocated=False)]
                t0 = time.perf_counter()
                await stub.Allocate(req)
                ours.append((time.perf_counter() - t0) * 1e3)
                progress.update(progress.done + 1, f"allocate, {n_pods} pods")
    finally:
        await plugin.stop()
    return base, ours


def coordinator_overhead(sock: Path, body_ms: float, progress: Progress) -> tuple[float, float]:
    """Per-iteration wall time (ms) without and with the coordinator."""
    loop = asyncio.new_event_loop()
    coord = LaneCoordinator(sock, policy="FAIR")
    loop.run_until_complete(coord.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        t0 = time.perf_counter()
        for _ in range(ITERATIONS):
            time.sleep(body_ms / 1e3) if body_ms else None
        plain = (time.perf_counter() - t0) * 1e3 / ITERATIONS
        with LaneClient(str(sock), lane="l1", job="j1") as lane:
            t0 = time.perf_counter()
            for i in range(ITERATIONS):
                with lane.iteration(last=i == ITERATIONS - 1):
                    time.sleep(body_ms / 1e3) if body_ms else None
                progress.update(progress.done + 1, f"coordinator, {body_ms} ms body")
            coordinated = (time.perf_counter() - t0) * 1e3 / ITERATIONS
    finally:
        asyncio.run_coroutine_threadsafe(coord.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    return plain, coordinated


def main() -> None:
    sizes = [10, 100, 1000]
    bodies = [0.0, 1.0, 10.0]
    d = Path(tempfile.mkdtemp(prefix="tsb-", dir="/tmp"))
    try:
        with Progress(len(sizes) * CALLS + len(bodies) * ITERATIONS, "agent bench", enabled=True) as progress:
            alloc = [(n, *asyncio.run(allocate_latency(n, d, progress))) for n in sizes]
            coord = [(b, *coordinator_overhead(d / "coord.sock", b, progress)) for b in bodies]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"\nAllocate over gRPC on a unix socket, {CALLS} calls each (ms)")
    print(
        f"{'pods':>6} | {'RPC floor p50':>13} {'p99':>7} | {'Allocate p50':>12} {'p99':>7} | "
        f"{'p50 ratio':>9} {'p99 ratio':>9} | {'p50 vs 10 pods':>14}"
    )
    first = statistics.median(alloc[0][2])
    for n, base, ours in alloc:
        print(
            f"{n:>6} | {statistics.median(base):>13.3f} {pct(base, 0.99):>7.3f} | "
            f"{statistics.median(ours):>12.3f} {pct(ours, 0.99):>7.3f} | "
            f"{statistics.median(ours) / statistics.median(base):>9.2f} {pct(ours, 0.99) / pct(base, 0.99):>9.2f} | "
            f"{statistics.median(ours) / first:>14.2f}"
        )
    print(f"\nLane coordinator, one job, {ITERATIONS} iterations (ms per iteration)")
    print(f"{'body':>6} | {'without':>8} | {'with':>8} | {'overhead':>8} | {'ratio':>6}")
    for body, plain, with_coord in coord:
        print(
            f"{body:>6.1f} | {plain:>8.3f} | {with_coord:>8.3f} | {with_coord - plain:>8.3f} | "
            f"{with_coord / plain if plain > 0 else float('inf'):>6.2f}"
        )
    print("\noverhead = one begin + one end round trip on the coordinator's unix socket per iteration")


if __name__ == "__main__":
    main()
