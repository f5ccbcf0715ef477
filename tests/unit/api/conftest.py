"""Shared fixtures: the example manifests and their expected errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
VALID = sorted(EXAMPLES.glob("*.yaml"))
INVALID = sorted((EXAMPLES / "invalid").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def expected_errors(path: Path) -> set[tuple[str, str]]:
    """`# expect: <field path>: <message>` lines at the top of an invalid example."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("# expect: "):
            field_path, message = line.removeprefix("# expect: ").split(": ", 1)
            out.add((field_path, message))
    return out
