"""`tessera gateway`: serve models over the Open Inference Protocol with policy-driven batching."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from tessera.gateway.config import ConfigError, GatewayConfig
from tessera.gateway.server import Gateway, make_gateway_app
from tessera.gateway.v2_routes import serve

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="run the serving gateway (KServe v2 HTTP, batches formed by Orloj/Symphony/baselines)",
        description=(
            "Serve /v2/models/{name}/infer for the models in --config, batch requests with each model's "
            "scheduler and dispatch the batches to its workers (`tessera worker`). Metrics at /metrics."
        ),
    )
    parser.add_argument("--config", required=True, help="gateway configuration (YAML or JSON)")
    parser.add_argument("--host", help="address to listen on (default: the config's host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: the config's port, 8080)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the profiler's request sampling")
    parser.add_argument(
        "--grpc-port",
        type=int,
        help="also serve the Open Inference Protocol over gRPC on this port (same host, same models; "
        "default: the config's grpc_port, none)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = GatewayConfig.load(args.config)
    except ConfigError as err:
        print(f"tessera gateway: {err}", file=sys.stderr)
        return 2
    host = args.host or config.host
    port = args.port if args.port is not None else config.port
    grpc_port = args.grpc_port if args.grpc_port is not None else config.grpc_port
    app = make_gateway_app(Gateway(config, seed=args.seed), grpc_port=grpc_port, grpc_host=host)
    try:
        serve(app, host, port)
    except ConfigError as err:  # a model its scheduler refuses, found when the gateway starts
        print(f"tessera gateway: {err}", file=sys.stderr)
        return 2
    return 0
