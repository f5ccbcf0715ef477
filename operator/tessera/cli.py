"""The `tessera` command line. Subcommands live in `tessera.commands.<name>` and register themselves."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

import tessera
import tessera.commands

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera", description="Fair, fractional GPU scheduling for Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"tessera {tessera.__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help=f"log level, one of {', '.join(LOG_LEVELS)} (any case); default WARNING",
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
    try:
        rc: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`tessera validate ... | head`): stop quietly, as cat does. stdout goes to
        # /dev/null so that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
