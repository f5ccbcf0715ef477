"""Logging for every Tessera command line (`tessera`, `tessera-agent`): the same flags, the same records,
and the same quiet end when stdout's reader goes away.

`--log-level` (any case; default WARNING, so a command is quiet unless something is wrong) and
`--log-format json|text` (default json: one JSON object per line on stderr, what a log collector reads).
JSON records are written by python-json-logger, so a message holding quotes, backslashes or newlines is
still one valid JSON object; the keys are `ts`, `level`, `logger`, `msg` (and `exc_info` with a traceback
when one is logged, plus any `extra=` fields).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Final, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS: Final = ("json", "text")
DEFAULT_LEVEL: Final = "WARNING"
DEFAULT_FORMAT: Final = "json"

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_RENAME = {"asctime": "ts", "levelname": "level", "name": "logger", "message": "msg"}
# Record attributes that are not fields: the LogRecord's own, and what kopf's object loggers attach beside
# `k8s_ref` (which is kept: the object a line is about). kopf's `settings` cannot even be copied.
_NOT_FIELDS = (*RESERVED_ATTRS, "taskName", "settings", "k8s_skip")


def _as_text(value: object) -> str:
    """Any other value an `extra=` carries is written as its text, so no record is ever lost to it."""
    return str(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--log-level` and `--log-format` to a command's parser; a bad value is a usage error (exit 2)."""
    parser.add_argument(
        "--log-level",
        default=DEFAULT_LEVEL,
        type=str.upper,
        choices=LEVELS,
        metavar="LEVEL",
        help=f"log level, one of {', '.join(LEVELS)} (any case); default {DEFAULT_LEVEL}",
    )
    parser.add_argument(
        "--log-format",
        default=DEFAULT_FORMAT,
        type=str.lower,
        choices=FORMATS,
        metavar="FORMAT",
        help=f"log records as json (one object per line) or text; default {DEFAULT_FORMAT}",
    )


def formatter(fmt: str) -> logging.Formatter:
    """The formatter for `fmt` (json or text)."""
    if fmt == "json":
        return JsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields=_RENAME,
            reserved_attrs=_NOT_FIELDS,
            json_default=_as_text,
            json_ensure_ascii=False,
        )
    if fmt == "text":
        return logging.Formatter(_TEXT)
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on `sys.stderr` as it is when a record is written, not when the handler was made: whoever
    swaps sys.stderr later (pytest's per-test capture, a daemon redirecting it) gets the lines instead of
    "I/O operation on closed file" from a stream that is gone."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass  # always the current sys.stderr


def setup(level: str = DEFAULT_LEVEL, fmt: str = DEFAULT_FORMAT, stream: TextIO | None = None) -> None:
    """Route the root logger to one handler on `stream` (default stderr) at `level` in `fmt`.

    Replaces the root's handlers, so calling it twice (tests, a command that re-parses) never doubles lines."""
    if level.upper() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def reader_went_away() -> int:
    """Exit status after a BrokenPipeError on stdout (`tessera validate ... | head`): stop quietly, as cat
    does. stdout is pointed at /dev/null so that the interpreter's own flush at exit does not raise again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
