#!/usr/bin/env python3
"""Write docs/scenario.schema.json (every `tessera simulate` scenario kind) and docs/trace.schema.json (a
training trace YAML) from the simulator's input models (run: .venv/bin/python hack/gen-scenario-schema.py
[--out DIR] [--check]). The loaders validate with the same models, so the schema and the simulator agree."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tessera.sim.schema import dumps, scenario_schema, trace_schema

ROOT = Path(__file__).resolve().parent.parent


def generated() -> dict[str, str]:
    return {"scenario.schema.json": dumps(scenario_schema()), "trace.schema.json": dumps(trace_schema())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="folder to write into (default: docs/)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a file on disk differs; write nothing")
    args = ap.parse_args()
    stale = []
    for name, text in generated().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    for path in stale:
        print(f"{path} is stale: run .venv/bin/python hack/gen-scenario-schema.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
