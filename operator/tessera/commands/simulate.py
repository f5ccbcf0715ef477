"""`tessera simulate [SCENARIO.yaml]`: run a scenario in the discrete-event simulator.

No argument runs the bundled default training scenario (Themis vs every baseline on 64 GPUs). A file is
dispatched on its top-level `kind` through tessera.sim.scenario.KINDS.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from tessera.api.safe_load import InputError, load_yaml_file
from tessera.sim.plotting import PlotsUnavailable, require_matplotlib
from tessera.sim.scenario import KINDS, ScenarioError

log = logging.getLogger(__name__)
DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "data" / "training-default.yaml"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a scenario in the simulator (default: Themis vs baselines on 64 GPUs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: the bundled training scenario)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--seed", type=int, help="override the scenario's seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--metrics-out",
        metavar="FILE",
        help="write the run as OpenMetrics (ρ per app per round, GPUs held) for Prometheus backfill "
        "(training scenarios)",
    )
    p.set_defaults(func=main)


def load_scenario(path: Path) -> tuple[Any, Any]:
    """Parse a scenario file and return (kind module, scenario). Raises ScenarioError naming the file."""
    source = str(path)
    if not path.exists():
        raise ScenarioError(source, "file", "not found")
    try:
        data = load_yaml_file(path)
    except InputError as e:  # unreadable, too big, not UTF-8, too deep, not YAML, NaN/inf at a field
        raise ScenarioError(source, e.field or "file", e.problem) from None
    if not isinstance(data, dict):
        raise ScenarioError(source, "file", "expected a mapping at the top level (kind, cluster, …)")
    kind = data.get("kind", "training")
    if not isinstance(kind, str) or kind not in KINDS:  # a list or mapping here is unhashable
        raise ScenarioError(source, "kind", f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    try:
        module = importlib.import_module(KINDS[kind])
    except ImportError as e:
        raise ScenarioError(source, "kind", f"kind {kind!r} is not available in this build ({e})") from None
    try:
        return module, module.load(data, source)
    except ScenarioError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        # A loader that missed a check: still one line naming the file, with the traceback at debug level.
        log.debug("loading %s", source, exc_info=True)
        raise ScenarioError(source, "file", f"malformed {kind} scenario ({type(e).__name__}: {e})") from None


def main(args: argparse.Namespace) -> int:
    path = Path(args.scenario) if args.scenario else DEFAULT_SCENARIO
    if args.plots:
        try:  # before the run, not after it
            require_matplotlib()
        except PlotsUnavailable as e:
            print(f"error: --plots: {e}", file=sys.stderr)
            return 2
    try:
        module, scenario = load_scenario(path)
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.seed is not None:
        if dataclasses.is_dataclass(scenario) and any(f.name == "seed" for f in dataclasses.fields(scenario)):
            scenario = dataclasses.replace(scenario, seed=args.seed)  # type: ignore[type-var]
        else:
            print(f"error: {path}: seed: this scenario kind takes no seed", file=sys.stderr)
            return 2
    metrics_out = getattr(args, "metrics_out", None)
    if metrics_out and module.__name__ != KINDS["training"]:
        print(f"error: {path}: --metrics-out is only available for training scenarios", file=sys.stderr)
        return 2
    try:
        result = module.run(scenario, progress=not args.no_progress and not args.json)
    except ScenarioError as e:  # found only once the trace is resolved (e.g. an added app's id is taken)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        print(result.table())
    if args.plots:
        for p in result.plots(Path(args.plots)):
            print(f"wrote {p}", file=sys.stderr)
    if metrics_out:
        from tessera.sim.metrics_export import write_training_openmetrics

        try:
            n = write_training_openmetrics(result, metrics_out)
        except (OSError, ValueError) as e:
            print(f"error: --metrics-out {metrics_out}: {e}", file=sys.stderr)
            return 2
        print(f"wrote {n} samples to {metrics_out}", file=sys.stderr)
    return 0
