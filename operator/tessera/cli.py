"""The `tessera` command line. Subcommands live in `tessera.commands.<name>` and register themselves."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

import tessera
import tessera.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera", description="Fair, fractional GPU scheduling for Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"tessera {tessera.__version__}")
    parser.add_argument(
        "--log-level", default="WARNING", help="log level (DEBUG, INFO, WARNING, ERROR); default WARNING"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(tessera.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tessera.commands.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format='{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    if args.command is None:
        parser.print_help()
        return 2
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
