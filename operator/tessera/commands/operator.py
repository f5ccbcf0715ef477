"""`tessera operator`: run the kopf operator (App via Themis rounds) with the controller registry."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any, Final

import kopf
from pydantic import ValidationError

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
    _scope_options(parser)
    _themis_options(parser.add_argument_group("Themis"))
    _endpoint_options(parser.add_argument_group("pods and endpoints"))
    parser.set_defaults(func=run)


def _scope_options(parser: argparse.ArgumentParser) -> None:
    """Which namespaces this replica serves, and how replicas share the work (kopf peering)."""
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
        "--ledger-namespace",
        default=None,
        help="namespace of the arbiter's renewal ledger ConfigMap, shared by peering replicas (default: "
        "$POD_NAMESPACE, else the first --namespace, else default)",
    )


def _themis_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--lease-seconds", type=float, default=600.0, help="Themis lease period (default 600)")
    group.add_argument("--fairness-knob", type=float, default=0.8, help="Themis f in [0, 1] (default 0.8)")
    group.add_argument(
        "--starving-rank",
        choices=("fair_share", "cap"),
        default="fair_share",
        help="how the filter ranks an App holding no GPUs: at the ρ it would reach on a fair share from now "
        "(fair_share, default) or ahead of every App holding GPUs, by arrival (cap: the paper's literal rule)",
    )
    group.add_argument(
        "--renew-in-place",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at lease end, give an App back the GPUs it held when that places it no worse for its slowdown "
        "(default); --no-renew-in-place places it as a newcomer would be",
    )
    group.add_argument(
        "--leftover-order",
        choices=("random", "holders"),
        default="random",
        help="who gets the GPUs no auction claimed: Apps at random (random, default: Themis' rule), or first "
        "the Apps that held them until their lease ended (holders: fewer checkpoint-and-restart moves)",
    )
    group.add_argument(
        "--preemption-grace-seconds", type=int, default=30, help="SIGTERM→SIGKILL window on lease loss (30)"
    )
    group.add_argument(
        "--admission-threshold", type=float, default=None, help="reject Apps past this × cluster GPUs (off)"
    )
    group.add_argument("--seed", type=int, default=0, help="seed of the leftover allocation's randomness")
    group.add_argument(
        "--status-max-staleness-seconds",
        type=float,
        default=None,
        help="an App status is rewritten at least this often (elapsed time, GPU-seconds, and lease expiries "
        "a round renewed, which until then only the ledger holds); default: the lease period",
    )


def _endpoint_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--socket-group",
        type=int,
        default=0,
        help="group id of the node agent's sockets, added to supplementalGroups of every pod created (0: none)",
    )
    group.add_argument(
        "--lanes-api",
        choices=("devicePlugin", "dra", "auto"),
        default="devicePlugin",
        help="how worker pods get their lanes: extended resources placed by the scheduler extender "
        "(devicePlugin, default) or ResourceClaimTemplates selecting the GPUs the policies chose (dra; the "
        "node agent must run the DRA driver, docs/dra.md); auto: dra when a dry-run template keeps its "
        "capacity requests (consumable capacity on), else devicePlugin with a Warning Event on this pod",
    )
    group.add_argument(
        "--gateway-image",
        default="tessera:latest",
        help="image of the serving gateway pods a ModelDeployment gets (the chart passes its own image)",
    )
    group.add_argument("--metrics-port", type=int, default=9090, help="Prometheus port (0 disables)")
    group.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL ('' disables)"
    )
    group.add_argument(
        "--pass-deadline-seconds",
        type=float,
        default=None,
        help="the liveness probe fails once a round or pass has run this long (default: the lease period, "
        "at least 60)",
    )


# OperatorConfig field → the flag that sets it (its argparse destination follows from the flag's name).
FLAGS: Final = {
    "lease_s": "--lease-seconds",
    "fairness_knob": "--fairness-knob",
    "starving_rank": "--starving-rank",
    "renew_in_place": "--renew-in-place",
    "leftover_order": "--leftover-order",
    "preemption_grace_s": "--preemption-grace-seconds",
    "admission_threshold": "--admission-threshold",
    "seed": "--seed",
    "namespaces": "--namespace",
    "standalone": "--standalone",
    "peering_name": "--peering",
    "priority": "--priority",
    "peering_lifetime_s": "--peering-lifetime-seconds",
    "socket_group": "--socket-group",
    "lanes_api": "--lanes-api",
    "pass_deadline_s": "--pass-deadline-seconds",
    "gateway_image": "--gateway-image",
    "status_max_staleness_s": "--status-max-staleness-seconds",
    "ledger_namespace": "--ledger-namespace",
}


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """The parsed flags as settings; pydantic's ValidationError (a ValueError) names the refused field."""
    given = {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in FLAGS.items()}
    given["ledger_namespace"] = given["ledger_namespace"] or os.environ.get("POD_NAMESPACE") or None
    return OperatorConfig(clusterwide=not args.namespace, **given)


def config_problem(err: ValidationError) -> str:
    """One line naming each refused flag and its field: `--lease-seconds (lease_s): must be > 0`."""
    from tessera.api.resources import input_errors  # the resource models load only on errors

    return "; ".join(
        f"{FLAGS[path.partition('[')[0]]} ({path}): {msg}" if path.partition("[")[0] in FLAGS else msg
        for path, msg in input_errors(err)
    )


async def _resolve_lanes_api(namespace: str) -> str:
    from tessera.dra_support import operator_lanes_api
    from tessera.kube import KubeClient, default_config

    api = KubeClient(default_config())
    try:
        return await operator_lanes_api(api, namespace, os.environ.get("POD_NAME"))
    finally:
        await api.close()


def run(args: argparse.Namespace) -> int:
    if args.lanes_api == "auto":  # decided once, before any handler runs (the agents decide alike)
        namespace = os.environ.get("POD_NAMESPACE") or (args.namespace or ["default"])[0]
        args.lanes_api = asyncio.run(_resolve_lanes_api(namespace))
    try:
        config = config_from_args(args)
    except ValidationError as err:
        print(f"tessera operator: {config_problem(err)}", file=sys.stderr)
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
