"""The `tessera` command line. Subcommands live in `tessera.commands.<name>` and register themselves."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import tessera
import tessera.commands
from tessera import logs

LOG_LEVELS = logs.LEVELS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera", description="Fair, fractional GPU scheduling for Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"tessera {tessera.__version__}")
    logs.add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(tessera.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tessera.commands.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # inside: `tessera --help | head -1` meets a closed pipe too
        logs.setup(args.log_level, args.log_format)
        if args.command is None:
            parser.print_help()
            return 2
        rc: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return logs.reader_went_away()
    return rc


if __name__ == "__main__":
    sys.exit(main())
