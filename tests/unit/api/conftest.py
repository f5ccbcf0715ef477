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


def documents(path: Path) -> list[dict[str, Any]]:
    """The Tessera objects of an example file, in order (not the Namespace it creates beside them)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert all(isinstance(d, dict) for d in docs)
    return [d for d in docs if str(d.get("apiVersion", "")).startswith("tessera.io/")]


def load(path: Path) -> dict[str, Any]:
    """The one Tessera object of an example file."""
    (doc,) = documents(path)
    return doc


def expected_errors(path: Path) -> set[tuple[str, str]]:
    """`# expect: <field path>: <message>` lines at the top of an invalid example."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("# expect: "):
            field_path, message = line.removeprefix("# expect: ").split(": ", 1)
            out.add((field_path, message))
    return out
