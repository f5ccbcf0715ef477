"""What `tessera simulate` runs: a scenario file names its kind, and each kind's module runs it.

A scenario YAML has a top-level `kind` (default `training`). Each kind is a module exposing

    load(data: dict, source: str) -> Scenario        # validate (its input model, tessera.sim.inputs);
                                                     # raise ScenarioError naming file+field
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
    "packing": "tessera.sim.packing.scenario",  # FGD and the GPU packing baselines on Alibaba's trace
    "orion": "tessera.sim.orion.scenario",  # one GPU shared by HP and BE clients (Orion, node policy)
}


# Caps on a scenario's sizes, named in the error when passed: a simulation of this size runs in minutes on a
# laptop; far past it, it would not finish (`apps: 1000000000000` used to run forever).
MAX_APPS = 100_000
MAX_GPUS = 100_000  # GPUs (or devices) of a simulated cluster
MAX_MACHINES = 100_000
MAX_TRIALS = 100_000
MAX_REQUESTS = 10_000_000
MAX_RUNS = 1_000
MAX_BUDGET = 100_000  # a tuning trial's largest budget (Hyperband's R)
MAX_SECONDS = 10 * 365 * 86400  # simulated durations and arrival times: ten years
MAX_NUMBER = 1e12  # any other number a scenario gives


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
