"""`tessera extender`: run the scheduler extender (filter, prioritize, bind) for tessera-scheduler."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import math
import signal
import ssl
import sys
from typing import Any

from aiohttp import web

from tessera.api import contract
from tessera.extender.handoff import Handoffs
from tessera.extender.metrics import make_metrics_app
from tessera.extender.server import Extender, make_app
from tessera.extender.view import DEFAULT_HP_PRIORITY_CLASSES, SchedulerCache
from tessera.kube import KubeClient, KubeConfig, KubeError
from tessera.policy.lanes.placement import STRATEGIES, PlacementConfig, PlacementError

log = logging.getLogger(__name__)
SHUTDOWN_SECONDS = 10.0


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "extender",
        help="run the kube-scheduler extender for tessera-scheduler",
        description=(
            "Serve POST /filter, /prioritize and /bind (kube-scheduler extender JSON) and GET /healthz. "
            "The view of nodes, GPUs and lanes comes from the API server (list + watch)."
        ),
    )
    _listen_options(parser)
    _cluster_options(parser)
    _placement_options(parser)
    _handoff_options(parser)
    parser.set_defaults(func=run)


def _listen_options(parser: argparse.ArgumentParser) -> None:
    """Where the extender and its metrics listen, and the TLS that guards /bind."""
    parser.add_argument("--port", type=int, default=8888, help="port to listen on (default 8888)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: kube-scheduler in the same pod). Any other address "
        "needs --tls-cert-file, --tls-key-file and --tls-client-ca-file: /bind acts with the scheduler's "
        "credentials, so only a client holding a certificate of that CA may call it",
    )
    parser.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key-file", help="private key of --tls-cert-file (PEM)")
    parser.add_argument(
        "--tls-client-ca-file",
        help="require a client certificate signed by this CA (PEM): kube-scheduler's extender tlsConfig",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9101,
        help="serve Prometheus metrics and /healthz at http://METRICS_HOST:PORT (default 9101; 0 disables)",
    )
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        help="address of the metrics listener (default 0.0.0.0: read-only, for Prometheus and probes)",
    )


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    """How the extender reaches the API server."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account (default)")
    parser.add_argument("--context", help="kubeconfig context (default: current-context)")


def _placement_options(parser: argparse.ArgumentParser) -> None:
    """How nodes and GPUs are scored and which pods count as latency-critical."""
    parser.add_argument(
        "--score",
        action="append",
        metavar="STRATEGY=WEIGHT",
        help=f"scoring weight, repeatable; strategies: {', '.join(STRATEGIES)} "
        "(default binpack=1 interference=1 fragmentation=1)",
    )
    parser.add_argument(
        "--packing",
        choices=("fgd", "weights"),
        default="fgd",
        help="how plain GPU pods are scored: fgd (least fragmentation growth against the pods seen, "
        "docs/extender.md) or weights (the --score weights)",
    )
    parser.add_argument(
        "--dra-claims",
        action="store_true",
        help=f"DRA lanes: list and watch ResourceClaims, count what allocated ones hold on each GPU, and score "
        f"pods asking {contract.DRA_DEVICE_CLASS} through claims by the packing rule (docs/dra.md, "
        '"Packing through DRA")',
    )
    parser.add_argument(
        "--best-effort-overcommit",
        type=float,
        default=1.0,
        help="how far best-effort compute shares may add up past 100%% on GPUs without latency-critical work",
    )
    parser.add_argument(
        "--hp-priority-class",
        action="append",
        default=None,
        metavar="NAME",
        help="a priorityClassName that makes a pod latency-critical (at most one per GPU) when its "
        f"{contract.ANN_WORKLOAD} annotation names no class; give the node agent's --hp-priority-class "
        f"values (repeatable; default {contract.CLASS_LATENCY_CRITICAL})",
    )


def _handoff_options(parser: argparse.ArgumentParser) -> None:
    """One GPU pod per node between bind and the node agent's Allocate (docs/extender.md, "Handoff")."""
    parser.add_argument(
        "--allocate-handoff",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bind a GPU pod to a node only once no other pod there waits for its Allocate (default on; "
        "off lets two pods wait at once, and the node agent then refuses the Allocate it cannot attribute)",
    )
    parser.add_argument(
        "--handoff-wait",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="how long a bind waits for its node to be handed on before it is refused and retried later "
        "(default 3; keep it below the scheduler's extender httpTimeout)",
    )
    parser.add_argument(
        "--handoff-stale",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a pod not allocated this long after its bind stops holding its node (default 60)",
    )


def handoffs(args: argparse.Namespace) -> Handoffs | None:
    if not getattr(args, "allocate_handoff", True):
        return None
    wait, stale = getattr(args, "handoff_wait", 3.0), getattr(args, "handoff_stale", 60.0)
    if not (math.isfinite(wait) and wait >= 0):
        raise PlacementError(f"--handoff-wait wants a non-negative number of seconds, got {wait}")
    if not (math.isfinite(stale) and stale > 0):
        raise PlacementError(f"--handoff-stale wants a positive number of seconds, got {stale}")
    return Handoffs(stale_s=stale)


def placement_config(args: argparse.Namespace) -> PlacementConfig:
    weights = []
    for item in args.score or []:
        name, _, value = item.partition("=")
        try:
            weights.append((name.strip(), float(value)))
        except ValueError:
            raise PlacementError(f"--score wants STRATEGY=WEIGHT, got {item!r}") from None
    kwargs: dict[str, Any] = {"best_effort_overcommit": args.best_effort_overcommit}
    kwargs["packing"] = getattr(args, "packing", "weights") == "fgd"
    if weights:
        kwargs["weights"] = tuple(weights)
    return PlacementConfig(**kwargs)


class ListenError(ValueError):
    """A listener the flags do not allow or cannot set up."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The server's TLS context (client certificates required) from the --tls-* flags, or None without them.

    Listening anywhere but loopback without TLS and client-certificate verification is refused: any pod
    that reaches the port could otherwise bind pods wherever it likes with the scheduler's credentials."""
    files = (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
    if not any(files):
        if not is_loopback(args.host):
            raise ListenError(
                f"--host {args.host} is not loopback: give --tls-cert-file, --tls-key-file and "
                "--tls-client-ca-file so that only kube-scheduler (its extender tlsConfig) can call /bind"
            )
        return None
    if not all(files):
        raise ListenError("--tls-cert-file, --tls-key-file and --tls-client-ca-file go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(args.tls_cert_file, args.tls_key_file)
        context.load_verify_locations(cafile=args.tls_client_ca_file)
    except (OSError, ssl.SSLError) as err:
        raise ListenError(f"cannot load the TLS files: {err}") from None
    return context


def hp_priority_classes(args: argparse.Namespace) -> tuple[str, ...]:
    names = tuple(
        n.strip() for n in (getattr(args, "hp_priority_class", None) or DEFAULT_HP_PRIORITY_CLASSES)
    )
    if not all(names):
        raise PlacementError("--hp-priority-class wants a priorityClassName, got an empty one")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        config = placement_config(args)
        hp_classes = hp_priority_classes(args)
        handoff = handoffs(args)
        tls = tls_context(args)
        kube_config = (
            KubeConfig.from_kubeconfig(args.kubeconfig, args.context)
            if args.kubeconfig
            else KubeConfig.in_cluster()
        )
    except (PlacementError, KubeError, ListenError) as err:
        print(f"tessera extender: {err}", file=sys.stderr)
        return 2
    for flag, value in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if not 0 <= value <= 65535:
            print(f"tessera extender: {flag} {value} is outside 0..65535", file=sys.stderr)
            return 2
    try:
        asyncio.run(
            _serve(
                kube_config,
                config,
                args.host,
                args.port,
                args.metrics_port,
                tls,
                args.metrics_host,
                hp_classes,
                handoff,
                args.handoff_wait,
                getattr(args, "dra_claims", False),
            )
        )
    except OSError as err:  # the address is taken or not on this machine
        print(f"tessera extender: cannot listen: {err}", file=sys.stderr)
        return 2
    return 0


async def _serve(
    kube_config: KubeConfig,
    config: PlacementConfig,
    host: str,
    port: int,
    metrics_port: int = 0,
    tls: ssl.SSLContext | None = None,
    metrics_host: str = "0.0.0.0",
    hp_classes: tuple[str, ...] = DEFAULT_HP_PRIORITY_CLASSES,
    handoff: Handoffs | None = None,
    handoff_wait_s: float = 3.0,
    claims: bool = False,
) -> None:
    kube = KubeClient(kube_config)
    extender = Extender(
        kube,
        view=SchedulerCache(hp_classes),
        config=config,
        handoffs=handoff,
        handoff_wait_s=handoff_wait_s,
        claims=claims,
    )
    # In-flight binds get this long to finish after SIGTERM (kube-scheduler's httpTimeout is a few seconds).
    runner = web.AppRunner(make_app(extender), shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    runners = [runner]
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls).start()
        log.info("extender listening on %s://%s:%d", "https" if tls else "http", host, port)
        if metrics_port:
            metrics_app = make_metrics_app(extender.metrics, extender.view)
            metrics_app.router.add_get("/healthz", _healthz)
            metrics_runner = web.AppRunner(metrics_app, shutdown_timeout=1.0)
            await metrics_runner.setup()
            runners.append(metrics_runner)
            await web.TCPSite(metrics_runner, metrics_host, metrics_port).start()
            log.info("extender metrics on http://%s:%d/metrics", metrics_host, metrics_port)
    except BaseException:
        for r in runners:
            await r.cleanup()
        await kube.close()
        raise
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
