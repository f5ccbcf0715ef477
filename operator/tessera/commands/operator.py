"""`tessera operator`: run the kopf operator (App via Themis rounds) with the controller registry."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

import kopf

from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import make_registry
from tessera.metrics import start_metrics_server

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the Tessera operator (kopf): Themis leases for Apps, worker pods, status and events",
        description=(
            "Reconcile tessera.io Apps: admission, a Themis arbiter round every lease period over all Apps, "
            "worker pods with placements, preemption with a grace period at lease expiry. Credentials come "
            "from the pod's service account, else the kubeconfig (KUBECONFIG or ~/.kube/config)."
        ),
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "-n", "--namespace", action="append", default=[], help="namespace to serve (repeatable)"
    )
    where.add_argument("-A", "--all-namespaces", action="store_true", help="serve all namespaces (default)")
    parser.add_argument("--peering", default="default", help="kopf peering object name (default: default)")
    parser.add_argument(
        "--priority", type=int, default=0, help="peering priority; the highest peer is active"
    )
    parser.add_argument("--standalone", action="store_true", help="no peering (single replica only)")
    parser.add_argument(
        "--peering-lifetime-seconds",
        type=int,
        default=60,
        help="how long a silent peer counts as alive: the longest a standby waits to take over (60)",
    )
    parser.add_argument(
        "--lease-seconds", type=float, default=600.0, help="Themis lease period (default 600)"
    )
    parser.add_argument("--fairness-knob", type=float, default=0.8, help="Themis f in [0, 1] (default 0.8)")
    parser.add_argument(
        "--starving-rank",
        choices=("fair_share", "cap"),
        default="fair_share",
        help="how the filter ranks an App holding no GPUs: at the ρ it would reach on a fair share from now "
        "(fair_share, default) or ahead of every App holding GPUs, by arrival (cap: the paper's literal rule)",
    )
    parser.add_argument(
        "--preemption-grace-seconds", type=int, default=30, help="SIGTERM→SIGKILL window on lease loss (30)"
    )
    parser.add_argument(
        "--admission-threshold", type=float, default=None, help="reject Apps past this × cluster GPUs (off)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the leftover allocation's randomness")
    parser.add_argument(
        "--socket-group",
        type=int,
        default=0,
        help="group id of the node agent's sockets, added to supplementalGroups of every pod created (0: none)",
    )
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus port (0 disables)")
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL ('' disables)"
    )
    parser.add_argument(
        "--pass-deadline-seconds",
        type=float,
        default=None,
        help="the liveness probe fails once a round or pass has run this long (default: the lease period, "
        "at least 60)",
    )
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(
        lease_s=args.lease_seconds,
        fairness_knob=args.fairness_knob,
        starving_rank=args.starving_rank,
        preemption_grace_s=args.preemption_grace_seconds,
        admission_threshold=args.admission_threshold,
        seed=args.seed,
        clusterwide=not args.namespace,
        namespaces=tuple(args.namespace),
        standalone=args.standalone,
        peering_name=args.peering,
        priority=args.priority,
        peering_lifetime_s=args.peering_lifetime_seconds,
        socket_group=args.socket_group,
        pass_deadline_s=args.pass_deadline_seconds,
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        if not 0.0 <= config.fairness_knob <= 1.0:
            raise ValueError(f"--fairness-knob must be in [0, 1], got {config.fairness_knob}")
    except ValueError as err:
        print(f"tessera operator: {err}")
        return 2
    registry, ctl = make_registry(config)
    if args.metrics_port:
        start_metrics_server(args.metrics_port, registry=ctl.metrics.registry)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=config.clusterwide,
            namespaces=list(config.namespaces),
            standalone=config.standalone,
            priority=config.priority,
            peering_name=None if config.standalone else config.peering_name,
            liveness_endpoint=args.liveness or None,
        )
    )
    return 0
