"""Benchmark: the operator on kmock's Kubernetes emulator: App reconciles per second and one arbiter round.

    .venv/bin/python tests/bench/bench_operator.py [--quick] [--sizes 50,200,500]

For each size N it runs the real kopf operator in-process against kmock (as the integration tests do), with
N/2 GPUs on 8-GPU nodes and a clock the benchmark moves:
- reconciles/s: N Apps created through the API, until every one has a status the operator wrote;
- an arbiter round with all N Apps after every lease expired (so every GPU is re-auctioned), wall time on
  kmock (pods deleted and created, N status writes) next to the same round's pure policy time
  (`Themis.allocate` alone on the same states, cluster and free GPUs) as the baseline, with the ratio.
Growth columns give how each cost grows from one size to the next. "API calls per round" counts the
operator's own requests during the measured round by verb and resource (`KubeApi.counts`).

kmock keeps every request it served (for test assertions) and matches each new request against that whole
log, so the k-th request costs O(k) and a run of R requests O(R²): at 100 Apps that emulator cost was >90%
of the profile and hid the operator's own. The benchmark asserts nothing on the log, so by default it trims
it as it goes; `--keep-request-log` measures with the emulator's full log, as the integration tests run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kmock
import kopf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tessera.api import contract
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import make_registry
from tessera.controller.view import healthy_gpus
from tessera.progress import Progress

from tests.integration.clock import ManualClock
from tests.integration.operator.conftest import (
    APPS,
    NS,
    add_node,
    app_body,
    job,
    setup_api,
)

LEASE_S = 600.0


def _statused(k: kmock.KubernetesEmulator, n: int) -> int:
    done = 0
    for (res, _ns, _name), obj in list(k.objects.items()):
        if res == APPS and (dict(obj).get("status") or {}).get("phase"):
            done += 1
    return done


async def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def _trim_request_log(k: kmock.KubernetesEmulator, stop: asyncio.Event) -> None:
    """Drop kmock's served-request log as it grows. Safe at any await point: kmock appends a request and
    matches it against its reactions synchronously (kmock/_internal/apps.py, RawHandler.__call__)."""
    log_ = k._requests  # the emulator's request log; nothing in the benchmark reads it
    while not stop.is_set():
        del log_[:]
        await asyncio.sleep(0.01)


async def measure(n: int, progress: Progress, step: float, keep_log: bool) -> dict[str, Any]:
    clock = ManualClock()
    config = OperatorConfig(lease_s=LEASE_S, tick_s=1.0, standalone=True, clock=clock)
    async with kmock.KubernetesEmulator() as k, kmock.Server(k):
        setup_api(k)
        trim_stop = asyncio.Event()
        trimmer = None if keep_log else asyncio.create_task(_trim_request_log(k, trim_stop))
        gpus = max(8, n // 2)
        for i in range(gpus // 8):
            add_node(k, f"n{i}", 8)
        registry, ctl = make_registry(config, kopf.ConnectionInfo(server=str(k.url), insecure=True))
        stop = asyncio.Event()
        task = asyncio.create_task(
            kopf.operator(registry=registry, clusterwide=True, stop_flag=stop, standalone=True)
        )
        try:
            await _wait(lambda: len(ctl.view.nodes) == gpus // 8, 60, "nodes")
            url = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/apps"
            t0 = time.perf_counter()
            for i in range(n):
                body = app_body(f"a{i:04d}", [job("j1", iters=10_000 + 97 * i, gpus=1 + i % 4)])
                resp = await k.post(url, json=body)
                resp.raise_for_status()
            await _wait(lambda: _statused(k, n) == n, 600, "every App's status")
            reconcile_s = time.perf_counter() - t0
            progress.update(progress.done + step / 2, f"N={n}: {n / reconcile_s:.0f} reconciles/s")
            assert ctl.arbiter is not None
            arbiter = ctl.arbiter
            async with arbiter.lock:
                now = clock.advance(LEASE_S + 1)  # every lease has expired: the round re-auctions all GPUs
                # Baseline: the policy alone on the state the round will see (leases expired, all GPUs free).
                states_recs = copy.deepcopy(list(arbiter.records.values()))
                for rec in states_recs:
                    rec.expire(now)
                cluster = ctl.view.cluster()
                free = list(healthy_gpus(cluster))
                states = [r.state(now) for r in states_recs if not r.done]
                rng = copy.deepcopy(arbiter.rng)
                p0 = time.perf_counter()
                arbiter.themis.allocate(now, states, cluster, free, rng)
                policy_s = time.perf_counter() - p0
                assert ctl.api is not None
                before = Counter(ctl.api.counts)
                report = await arbiter.run_round(now)
                calls = ctl.api.counts - before
            round_s = report.seconds
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)
            trim_stop.set()
            if trimmer is not None:
                await trimmer
    progress.update(progress.done + step / 2, f"N={n}: round {round_s:.2f}s")
    return {
        "n": n,
        "gpus": gpus,
        "rps": n / reconcile_s,
        "round": round_s,
        "policy": policy_s,
        "calls": calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 20 and 100 only")
    parser.add_argument("--sizes", default=None, help="comma-separated App counts (default 50,200,500)")
    parser.add_argument(
        "--keep-request-log",
        action="store_true",
        help="keep kmock's full request log (each request then costs O(requests so far))",
    )
    args = parser.parse_args()
    sizes = [20, 100] if args.quick else [int(s) for s in (args.sizes or "50,200,500").split(",")]
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kopf").setLevel(logging.ERROR)
    logging.getLogger("aiohttp").setLevel(logging.ERROR)
    rows = []
    with Progress(sum(sizes), "operator bench", enabled=True) as progress:
        for n in sizes:
            rows.append(asyncio.run(measure(n, progress, n, args.keep_request_log)))
    print()
    print(
        f"{'apps':>5} {'GPUs':>5} {'reconciles/s':>13} {'round on kmock s':>17} {'Themis.allocate s':>18}"
        f" {'round/policy':>13} {'round growth':>13} {'policy growth':>14}"
    )
    prev: dict[str, float] | None = None
    for r in rows:
        grow_r = f"x{r['round'] / prev['round']:.1f}" if prev else "-"
        grow_p = f"x{r['policy'] / prev['policy']:.1f}" if prev else "-"
        print(
            f"{r['n']:>5} {r['gpus']:>5} {r['rps']:>13.1f} {r['round']:>17.3f} {r['policy']:>18.3f}"
            f" {r['round'] / r['policy']:>13.1f} {grow_r:>13} {grow_p:>14}"
        )
        prev = r
    print()
    print("API calls per round (the operator's own requests; events are posted alongside the round):")
    for r in rows:
        calls: Counter[tuple[str, str, str]] = r["calls"]
        parts = ", ".join(
            f"{verb} {group + '/' if group else ''}{res}: {c}"
            for (group, res, verb), c in sorted(calls.items())
        )
        print(f"{r['n']:>5} Apps: {sum(calls.values())} ({parts})")


if __name__ == "__main__":
    main()
