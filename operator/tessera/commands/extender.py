"""`tessera extender`: run the scheduler extender (filter, prioritize, bind) for tessera-scheduler."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from aiohttp import web

from tessera.extender.kube import KubeClient, KubeConfig, KubeError
from tessera.extender.metrics import make_metrics_app
from tessera.extender.server import Extender, make_app
from tessera.policy.lanes.placement import STRATEGIES, PlacementConfig, PlacementError

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "extender",
        help="run the kube-scheduler extender for tessera-scheduler",
        description=(
            "Serve POST /filter, /prioritize and /bind (kube-scheduler extender JSON) and GET /healthz. "
            "The view of nodes, GPUs and lanes comes from the API server (list + watch)."
        ),
    )
    parser.add_argument("--port", type=int, default=8888, help="port to listen on (default 8888)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9101,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default 9101; 0 disables)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account (default)")
    parser.add_argument("--context", help="kubeconfig context (default: current-context)")
    parser.add_argument(
        "--score",
        action="append",
        metavar="STRATEGY=WEIGHT",
        help=f"scoring weight, repeatable; strategies: {', '.join(STRATEGIES)} "
        "(default binpack=1 interference=1 fragmentation=1)",
    )
    parser.add_argument(
        "--best-effort-overcommit",
        type=float,
        default=1.0,
        help="how far best-effort compute shares may add up past 100%% on GPUs without latency-critical work",
    )
    parser.set_defaults(func=run)


def placement_config(args: argparse.Namespace) -> PlacementConfig:
    weights = []
    for item in args.score or []:
        name, _, value = item.partition("=")
        try:
            weights.append((name.strip(), float(value)))
        except ValueError:
            raise PlacementError(f"--score wants STRATEGY=WEIGHT, got {item!r}") from None
    kwargs: dict[str, Any] = {"best_effort_overcommit": args.best_effort_overcommit}
    if weights:
        kwargs["weights"] = tuple(weights)
    return PlacementConfig(**kwargs)


def run(args: argparse.Namespace) -> int:
    try:
        config = placement_config(args)
        kube_config = (
            KubeConfig.from_kubeconfig(args.kubeconfig, args.context)
            if args.kubeconfig
            else KubeConfig.in_cluster()
        )
    except (PlacementError, KubeError) as err:
        log.error("%s", err)
        return 2
    if not 0 <= args.metrics_port <= 65535:
        log.error("--metrics-port %d is outside 0..65535", args.metrics_port)
        return 2
    asyncio.run(_serve(kube_config, config, args.host, args.port, args.metrics_port))
    return 0


async def _serve(
    kube_config: KubeConfig, config: PlacementConfig, host: str, port: int, metrics_port: int = 0
) -> None:
    kube = KubeClient(kube_config)
    extender = Extender(kube, config=config)
    runner = web.AppRunner(make_app(extender))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("extender listening on %s:%d", host, port)
    runners = [runner]
    if metrics_port:
        metrics_runner = web.AppRunner(make_metrics_app(extender.metrics, extender.view))
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, host, metrics_port).start()
        runners.append(metrics_runner)
        log.info("extender metrics on http://%s:%d/metrics", host, metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await extender.sync_forever(stop)
    finally:
        for r in runners:
            await r.cleanup()
        await kube.close()
