"""Gateway overhead on loopback, per request: the time each request spends in the gateway (p50/p99), and
peak throughput next to calling a worker directly (the baseline), as the offered load grows.

    .venv/bin/python tests/bench/bench_gateway.py [--rates 20,40,80] [--duration 3] [--layers 1]

One `tessera worker` (early-exit demo model; ``--layers`` per request keeps compute small so the
transport dominates) and one `tessera gateway` with timeout batching at zero queue delay (max batch 16):
at low load every request is a batch of one; under load, requests that queue while the worker is busy go
out together. Per request, from the timestamps the gateway puts in every answer:

* ``in gateway`` — arrival to hand-off to the worker, less the time spent waiting in the queue for the
  scheduler (a policy decision, not overhead), plus answer back from the worker to answer built;
* ``queue`` — the time it waited for the scheduler (and for the worker to be free);
* ``client − worker`` — the client's latency less the gateway→worker round trip: everything the gateway
  adds, the extra loopback hop and HTTP stack included.

Peak throughput is the answered-request rate at the highest load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tessera.gateway.demo_models import early_exit_model
from tessera.gateway.loadgen import AppLoad, RequestResult, run_load
from tessera.progress import Progress

from tests.integration.gateway.gateway_harness import (
    MODEL,
    WIDTH,
    gateway_process,
    model_config,
    worker_process,
)


def payload(layers: int) -> dict[str, object]:
    x = np.random.default_rng(0).standard_normal(WIDTH).astype(np.float32)
    return {
        "inputs": [
            {"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": [round(float(v), 4) for v in x]},
            {"name": "n", "shape": [1, 1], "datatype": "INT64", "data": [layers]},
        ]
    }


def measure(url: str, rate: float, duration: float, layers: int) -> tuple[list[RequestResult], float]:
    app = AppLoad("bench", [payload(layers)], 1.0, 60_000.0)
    t0 = time.perf_counter()
    rs = asyncio.run(run_load(url, MODEL, [app], rate=rate, duration=duration, seed=1, progress=False))
    return rs, time.perf_counter() - t0


def overheads(rs: list[RequestResult]) -> tuple[np.ndarray, np.ndarray]:
    """Per answered request, ms: the gateway's own time, and client latency less the worker round trip."""
    ok = [r for r in rs if r.status == 200 and r.overhead_s is not None and r.worker_s is not None]
    own = np.array([r.overhead_s for r in ok], dtype=float) * 1000.0
    added = np.array([r.latency - r.worker_s for r in ok], dtype=float) * 1000.0  # type: ignore[operator]
    return own, added


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def stats(rs: list[RequestResult], elapsed: float) -> tuple[float, float, float]:
    lat = np.array([r.latency for r in rs if r.status == 200]) * 1000.0
    ok = float(lat.size)
    if not ok:
        return float("nan"), float("nan"), 0.0
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), ok / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="20,50,100,200", help="offered loads, requests/s")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per load level")
    ap.add_argument(
        "--layers", type=int, default=1, help="early-exit layers per request (compute per request)"
    )
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    model = early_exit_model(tmp / "early_exit.onnx", width=WIDTH)
    rows = []
    with worker_process(model) as (worker, _):
        cfg = model_config(
            "timeout",
            [worker],
            {"mean_solo_s": 0.001},
            slo_s=60.0,
            max_batch=16,
            batch_sizes=[1, 2, 4, 8, 16],
            timeout={"max_queue_delay_s": 0.0},
        )
        with gateway_process(cfg, tmp) as (gateway, _), Progress(2 * len(rates), "bench_gateway") as bar:
            measure(worker, 20, 0.5, args.layers)  # warm both paths
            measure(gateway, 20, 0.5, args.layers)
            for i, rate in enumerate(rates):
                direct = stats(*measure(worker, rate, args.duration, args.layers))
                bar.update(2 * i + 1)
                rs, elapsed = measure(gateway, rate, args.duration, args.layers)
                bar.update(2 * i + 2)
                rows.append((rate, direct, stats(rs, elapsed), overheads(rs)))
    print(
        f"\nGateway vs direct worker call on loopback ({args.layers} layer(s)/request, {args.duration:g} s per level)"
    )
    head = (
        f"{'offered/s':>10} | {'direct p50':>10} {'p99':>7} {'tput/s':>7} | {'gateway p50':>11} {'p99':>7} {'tput/s':>7}"
        f" | {'in gateway p50':>14} {'p99':>6} | {'client-worker p50':>17} {'p99':>6}"
    )
    print(head)
    print("-" * len(head))
    for rate, d, g, (own, added) in rows:
        print(
            f"{rate:>10.0f} | {d[0]:>10.2f} {d[1]:>7.2f} {d[2]:>7.1f} | {g[0]:>11.2f} {g[1]:>7.2f} {g[2]:>7.1f}"
            f" | {pct(own, 50):>14.3f} {pct(own, 99):>6.3f} | {pct(added, 50):>17.3f} {pct(added, 99):>6.3f}"
        )
    print(
        "latencies in ms, per request; 'in gateway' = arrival→hand-off less queueing, plus answer back→built;"
        " 'client-worker' = client latency less the gateway→worker round trip."
    )


if __name__ == "__main__":
    main()
