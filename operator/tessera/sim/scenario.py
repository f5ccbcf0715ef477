"""What `tessera simulate` runs: a scenario file names its kind, and each kind's module runs it.

A scenario YAML has a top-level `kind` (default `training`). Each kind is a module exposing

    load(data: dict, source: str) -> Scenario        # validate; raise ScenarioError naming file+field
    run(scenario, *, progress: bool) -> SimResult    # run every policy in the scenario

and a bundled default scenario file in `tessera/sim/data/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

KINDS: dict[str, str] = {
    "training": "tessera.sim.training.scenario",  # Themis and its baselines
    "tuning": "tessera.sim.tuning.scenario",  # Fluid and the tuning algorithms
    "serving": "tessera.sim.serving.scenario",  # Orloj, Symphony and batching baselines
    "placement": "tessera.sim.serving.placement_scenario",  # AlpaServe and its baselines
    "orion": "tessera.sim.orion.scenario",  # one GPU shared by HP and BE clients (Orion, node policy)
}


class ScenarioError(ValueError):
    """A bad scenario file. The message names the file, the field path and what is wrong."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: {field}: {problem}")


class SimResult(Protocol):
    def table(self) -> str:
        """A readable table for stdout."""
        ...

    def to_json(self) -> dict[str, Any]:
        """Everything in the table, for machines."""
        ...

    def plots(self, directory: Path) -> list[Path]:
        """Write PNG plots into `directory`; return their paths."""
        ...
