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
    asyncio.run(_serve(kube_config, config, args.host, args.port))
    return 0


async def _serve(kube_config: KubeConfig, config: PlacementConfig, host: str, port: int) -> None:
    kube = KubeClient(kube_config)
    extender = Extender(kube, config=config)
    runner = web.AppRunner(make_app(extender))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("extender listening on %s:%d", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await extender.sync_forever(stop)
    finally:
        await runner.cleanup()
        await kube.close()
