"""A tuning App inside a training trace (two-level scheduling, spec seed-salus-fluid §2.5 [L1659-1661]).

The cluster policy (Themis or a baseline) leases GPUs to the App like to any other; the App's runtime
(`two_level.FluidAppRuntime`) runs a tuning algorithm on a seeded workload and lets Fluid place its trials
inside whatever lease it holds. In a trace YAML the App carries a `tuning` block instead of `jobs`:

    - id: tune-cifar
      arrival: 600
      tuning:
        algorithm: hyperband          # hyperband | syncbohb | asha | bohb | pbt
        seed: 1                       # the workload's optimum and the algorithm's sampling
        max_gpus: 8                   # the most GPUs it asks for (default: the cluster)
        samples: 40                   # configs for asha/bohb
        max_budget: 27                # iterations per trial at most
        workload: {iter_time: 20, target: 0.85}   # tessera.sim.tuning.workload.Workload fields
        fluid: {max_pack: 2, max_workers: 4}      # c, d, ε (epsilon: the scenario's restart_s if unset)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.policy.fluid import FluidConfig
from tessera.sim.scenario import MAX_BUDGET, MAX_GPUS, MAX_TRIALS
from tessera.sim.tuning.experiments import ALGORITHMS
from tessera.sim.tuning.workload import Workload

_KEYS = {"algorithm", "seed", "max_gpus", "samples", "max_budget", "workload", "fluid"}
_WORKLOAD_KEYS = {f.name for f in dataclasses.fields(Workload)} - {"seed"}
_FLUID_KEYS = {f.name for f in dataclasses.fields(FluidConfig)}


class TuningSpecError(ValueError):
    """`field` (relative to the tuning block) and what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field, self.problem = field, problem


@dataclass(frozen=True, slots=True)
class TuningAppSpec:
    algorithm: str = "hyperband"
    seed: int = 0
    max_gpus: int | None = None  # None: the whole cluster
    samples: int = 40
    max_budget: int = 27
    workload: Workload = field(default_factory=Workload)
    fluid: FluidConfig = field(default_factory=FluidConfig)
    epsilon_given: bool = False  # the block set fluid.epsilon (else the simulator's restart cost is used)

    def to_dict(self) -> dict[str, Any]:
        w, base = dataclasses.asdict(self.workload), dataclasses.asdict(Workload())
        fluid = dataclasses.asdict(self.fluid)
        if not self.epsilon_given:
            fluid.pop("epsilon")
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "seed": self.seed,
            "samples": self.samples,
            "max_budget": self.max_budget,
            "workload": {k: v for k, v in w.items() if k in _WORKLOAD_KEYS and v != base[k]},
            "fluid": fluid,
        }
        if self.max_gpus is not None:
            out["max_gpus"] = self.max_gpus
        return out

    @staticmethod
    def parse(data: Any, cluster_gpus: int | None = None) -> TuningAppSpec:
        """Validate a `tuning` block; raises TuningSpecError naming the field."""
        if not isinstance(data, Mapping):
            raise TuningSpecError("", "expected a mapping with algorithm, seed, max_gpus, …")
        for k in data:
            if k not in _KEYS:
                raise TuningSpecError(str(k), f"unknown field; known: {', '.join(sorted(_KEYS))}")
        algorithm = data.get("algorithm", "hyperband")
        if algorithm not in ALGORITHMS:
            raise TuningSpecError("algorithm", f"unknown {algorithm!r}; known: {', '.join(ALGORITHMS)}")
        seed = check_int("seed", data.get("seed", 0), 0)
        samples = check_int("samples", data.get("samples", 40), 1, MAX_TRIALS)
        max_budget = check_int("max_budget", data.get("max_budget", 27), 2, MAX_BUDGET)
        max_gpus = None
        if data.get("max_gpus") is not None:
            max_gpus = check_int("max_gpus", data["max_gpus"], 1, MAX_GPUS)
            if cluster_gpus is not None and max_gpus > cluster_gpus:
                raise TuningSpecError("max_gpus", f"{max_gpus} GPUs asked but the cluster has {cluster_gpus}")
        workload = parse_workload(data.get("workload", {}))
        fluid_raw = check_block("fluid", data.get("fluid", {}), _FLUID_KEYS)
        fluid = parse_fluid(fluid_raw)
        return TuningAppSpec(
            algorithm, seed, max_gpus, samples, max_budget, workload, fluid, "epsilon" in fluid_raw
        )


def check_int(name: str, v: Any, minimum: int, maximum: int = (1 << 63) - 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise TuningSpecError(name, f"expected an integer >= {minimum}, got {v!r}")
    if v > maximum:
        raise TuningSpecError(name, f"{v} is more than {maximum}, the most a scenario accepts")
    return v


def check_block(name: str, v: Any, known: set[str]) -> dict[str, Any]:
    """A mapping whose keys are all in `known`."""
    if not isinstance(v, Mapping):
        raise TuningSpecError(name, f"expected a mapping, got {type(v).__name__}")
    for k in v:
        if k not in known:
            raise TuningSpecError(f"{name}.{k}", f"unknown field; known: {', '.join(sorted(known))}")
    return dict(v)


def parse_workload(v: Any) -> Workload:
    """A `workload` block: any Workload field but the seed (which comes from the run)."""
    raw = check_block("workload", v, _WORKLOAD_KEYS)
    try:
        return Workload(**raw)
    except (TypeError, ValueError) as e:
        raise TuningSpecError("workload", str(e)) from None


def parse_fluid(v: Any) -> FluidConfig:
    """A `fluid` block: c, d, ε and the mechanism switches."""
    raw = check_block("fluid", v, _FLUID_KEYS)
    try:
        return FluidConfig(**raw)
    except (TypeError, ValueError) as e:
        raise TuningSpecError("fluid", str(e)) from None
