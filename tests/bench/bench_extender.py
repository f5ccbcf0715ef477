"""Filter + prioritize latency (p50/p99) at 100, 1,000 and 5,000 nodes of 8 GPUs, half-filled, seeded.

Calls the extender's handlers in-process with kube-scheduler's ExtenderArgs (NodeNames, nodeCacheCapable)
— JSON and HTTP costs excluded; the baseline column is a fit-only filter (no scoring), so the ratio is the
cost of Tessera's scoring. Run: .venv/bin/python tests/bench/bench_extender.py
"""

from __future__ import annotations

import random
import statistics
import time

from tessera.api import contract
from tessera.extender.server import Extender
from tessera.extender.view import ClusterView, Holding
from tessera.policy.lanes.placement import GpuState, Tenant, why_not
from tessera.progress import Progress

CALLS = 60


def cluster(n: int, rng: random.Random) -> ClusterView:
    view = ClusterView()
    for k in range(n):
        name = f"node-{k}"
        view.nodes[name] = [GpuState(i, f"{name}-{i}", 16000) for i in range(8)]
        for i in range(8):
            if rng.random() < 0.5:
                view.hold(f"{name}-{i}", Holding(name, (i,), "g-l1", Tenant(rng.choice([4000, 8000]), 40)))
    return view


def pod() -> dict[str, object]:
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: "6000",
        contract.RESOURCE_GPU_COMPUTE: "30",
    }
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    sizes = [100, 1000, 5000]
    rows = []
    with Progress(len(sizes) * CALLS * 2, "extender", enabled=True) as progress:
        for n in sizes:
            ext = Extender(None, cluster(n, random.Random(n)))
            args = {"Pod": pod(), "Nodes": None, "NodeNames": list(ext.view.nodes)}
            ours, base = [], []
            for _ in range(CALLS):
                t0 = time.perf_counter()
                ext.filter(args)
                ext.prioritize(args)
                ours.append((time.perf_counter() - t0) * 1e3)
                progress.update(progress.done + 1, f"{n} nodes")
            from tessera.extender.view import pod_request

            for _ in range(CALLS):
                t0 = time.perf_counter()
                req = pod_request(args["Pod"], 16000)  # type: ignore[arg-type]
                assert req is not None
                [
                    n
                    for n, gpus in ext.view.nodes.items()
                    if any(why_not(g, req, ext.config) is None for g in gpus)
                ]
                base.append((time.perf_counter() - t0) * 1e3)
                progress.update(progress.done + 1, f"{n} nodes")
            rows.append((n, ours, base))
    print(
        f"\n{'nodes':>6} | {'fit-only p50':>12} {'p99':>8} | {'tessera p50':>11} {'p99':>8} | {'p99 ratio':>9} {'ms/node':>8}"
    )
    for n, ours, base in rows:
        print(
            f"{n:>6} | {statistics.median(base):>12.2f} {pct(base, 0.99):>8.2f} | "
            f"{statistics.median(ours):>11.2f} {pct(ours, 0.99):>8.2f} | {pct(ours, 0.99) / pct(base, 0.99):>9.2f} "
            f"{statistics.median(ours) / n:>8.4f}"
        )
    print(
        "\nms per filter + prioritize pair (prioritize re-evaluates every node); target p99 < 20 ms at 1,000 nodes."
    )


if __name__ == "__main__":
    main()
