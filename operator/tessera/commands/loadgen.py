"""`tessera loadgen`: open-loop load against a v2 inference endpoint; finish rate and latency percentiles."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tessera.gateway.loadgen import AppLoad, format_summary, load_payloads, run_load, summarize


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "loadgen",
        help="send Poisson/Gamma load with an application mix to a gateway; report finish rate and latency",
        description=(
            "Each --app is NAME:PAYLOAD_JSON[:WEIGHT[:DEADLINE_MS]]; PAYLOAD_JSON holds one v2 request body or a "
            "list of them (picked at random). Finish rate = answers within the deadline / requests sent."
        ),
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="gateway (or worker) base URL")
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument(
        "--app", action="append", required=True, help="NAME:PAYLOAD_JSON[:WEIGHT[:DEADLINE_MS]]"
    )
    parser.add_argument("--rate", type=float, required=True, help="mean requests per second")
    parser.add_argument("--arrivals", choices=("poisson", "gamma"), default="poisson")
    parser.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of gaps (gamma)")
    how_long = parser.add_mutually_exclusive_group(required=True)
    how_long.add_argument("--duration", type=float, help="seconds of load")
    how_long.add_argument("--requests", type=int, help="number of requests")
    parser.add_argument(
        "--deadline-ms", type=float, help="deadline of apps that name none (default: gateway's SLO)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def parse_app(spec: str, default_deadline: float | None) -> AppLoad:
    parts = spec.split(":")
    if len(parts) < 2 or len(parts) > 4 or not parts[0]:
        raise ValueError(f"--app wants NAME:PAYLOAD_JSON[:WEIGHT[:DEADLINE_MS]], got {spec!r}")
    try:
        weight = float(parts[2]) if len(parts) > 2 and parts[2] else 1.0
        deadline = float(parts[3]) if len(parts) > 3 and parts[3] else default_deadline
    except ValueError:
        raise ValueError(f"--app {spec!r}: WEIGHT and DEADLINE_MS must be numbers") from None
    return AppLoad(parts[0], load_payloads(parts[1]), weight, deadline)


def run(args: argparse.Namespace) -> int:
    try:
        apps = [parse_app(s, args.deadline_ms) for s in args.app]
        if args.rate <= 0:
            raise ValueError(f"--rate must be > 0, got {args.rate}")
        cv = 1.0 if args.arrivals == "poisson" else args.cv
        start = time.perf_counter()
        results = asyncio.run(
            run_load(
                args.url, args.model, apps, rate=args.rate, duration=args.duration,
                count=args.requests, cv=cv, seed=args.seed,
            )
        )  # fmt: skip
    except ValueError as err:
        print(f"tessera loadgen: {err}", file=sys.stderr)
        return 2
    summary = summarize(results, time.perf_counter() - start)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0
