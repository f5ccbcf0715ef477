"""`tessera worker`: run one ONNX model for a serving gateway (ONNX Runtime; CUDA when available)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from tessera.gateway.v2_routes import serve
from tessera.gateway.worker import ModelledCost, OnnxModel, Worker, make_worker_app

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run a serving worker for one ONNX model (KServe v2 HTTP plus the gateway's batch endpoint)",
        description="Load an ONNX model and run the batches a `tessera gateway` sends, reporting timings.",
    )
    parser.add_argument("--model", help="ONNX model file")
    parser.add_argument("--name", help="model name in the URLs (default: the file name without .onnx)")
    parser.add_argument(
        "--names",
        help="serve several models (a serving pool group's, e.g. $(TESSERA_MODEL)): comma-separated names, "
        "each loaded from --model-dir/<name>.onnx, or all from --model",
    )
    parser.add_argument("--model-dir", help="directory of <name>.onnx files for --names")
    parser.add_argument(
        "--stages",
        type=int,
        default=1,
        help="run each model as this many pipeline stages (a pool group's pp, $(TESSERA_PIPELINE_STAGES))",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9001, help="port to listen on (default 9001)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    parser.add_argument(
        "--provider",
        default="auto",
        help="execution provider, e.g. CPUExecutionProvider (default: CUDA if present)",
    )
    pace = parser.add_argument_group(
        "modelled cost",
        "pad each run to a modelled time, fixed + unit·max(INPUT)·(1 + growth·(rows − 1)), so the cost the "
        "schedulers see is controlled and input-dependent (tests, benchmarks); outputs are still computed",
    )
    pace.add_argument("--pace-input", metavar="INPUT", help="integer model input with each row's work")
    pace.add_argument("--pace-unit-ms", type=float, default=1.0, help="milliseconds per unit of work")
    pace.add_argument("--pace-growth", type=float, default=0.0, help="batch stretch per extra row")
    pace.add_argument("--pace-fixed-ms", type=float, default=0.0, help="milliseconds per run")
    parser.add_argument(
        "--write-demo-model",
        metavar="PATH",
        help="write the early-exit demo model (cost grows with its input n) to PATH and exit",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.write_demo_model:
        from tessera.gateway.demo_models import early_exit_model

        print(early_exit_model(args.write_demo_model))
        return 0
    names = [n for n in (args.names or "").split(",") if n]
    if not args.model and not (names and args.model_dir):
        print(
            "tessera worker: --model is required (or --names with --model-dir, or --write-demo-model PATH)",
            file=sys.stderr,
        )
        return 2
    try:
        cost = None
        if args.pace_input:
            cost = ModelledCost(
                args.pace_input, args.pace_unit_ms / 1000.0, args.pace_growth, args.pace_fixed_ms / 1000.0
            )
        kw = {"threads": args.threads, "provider": args.provider, "cost": cost, "stages": args.stages}
        if names:
            models = [
                OnnxModel(f"{args.model_dir}/{n}.onnx" if args.model_dir else args.model, name=n, **kw)
                for n in names
            ]
        else:
            models = [OnnxModel(args.model, name=args.name, **kw)]
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"tessera worker: {err}", file=sys.stderr)
        return 2
    serve(make_worker_app(Worker(*models)), args.host, args.port)
    return 0
