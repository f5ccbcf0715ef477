"""A tuning App inside a training trace (two-level scheduling, Fluid dissertation §3.4.3).

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
        workload: {iter_time: 20, target: 0.85}   # tessera.sim.tuning.workload.TuningWorkload fields
        fluid: {max_pack: 2, max_workers: 4}      # c, d, ε (epsilon: the scenario's restart_s if unset)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pydantic import field_validator

from tessera.policy.fluid import FluidConfig
from tessera.sim.inputs import Budget, Gpus, Input, Seed, Trials, given, mirror
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import ScenarioError
from tessera.sim.tuning.experiments import ALGORITHMS
from tessera.sim.tuning.workload import TuningWorkload

# A `workload` block sets any TuningWorkload field but the seed (which comes from the run); a `fluid` block any
# FluidConfig field (c, d, ε and the mechanism switches).
WorkloadInput = mirror(TuningWorkload, exclude=frozenset({"seed"}))
FluidInput = mirror(FluidConfig)


class TuningBlock(Input):
    """A trace App's `tuning` block."""

    algorithm: str = "hyperband"
    seed: Seed = 0
    max_gpus: Gpus | None = None
    """The most GPUs the app asks for; default: the whole cluster."""
    samples: Trials = 40
    max_budget: Budget = 27
    workload: WorkloadInput = WorkloadInput()  # type: ignore[valid-type]
    fluid: FluidInput = FluidInput()  # type: ignore[valid-type]

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        return known_algorithm(v)


def known_algorithm(v: str) -> str:
    if v not in ALGORITHMS:
        raise ValueError(f"unknown {v!r}; known: {', '.join(ALGORITHMS)}")
    return v


class TuningSpecError(ValueError):
    """`field` (relative to the tuning block) and what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field, self.problem = field, problem


def build_workload(block: Any) -> TuningWorkload:
    """The TuningWorkload a validated `workload` block describes (its own checks raise ValueError)."""
    return TuningWorkload(**given(block))


def build_fluid(block: Any) -> FluidConfig:
    return FluidConfig(**given(block))


@dataclass(frozen=True, slots=True)
class TuningAppSpec:
    algorithm: str = "hyperband"
    seed: int = 0
    max_gpus: int | None = None  # None: the whole cluster
    samples: int = 40
    max_budget: int = 27
    workload: TuningWorkload = field(default_factory=TuningWorkload)
    fluid: FluidConfig = field(default_factory=FluidConfig)
    epsilon_given: bool = False  # the block set fluid.epsilon (else the simulator's restart cost is used)

    def to_dict(self) -> dict[str, Any]:
        w, base = dataclasses.asdict(self.workload), dataclasses.asdict(TuningWorkload())
        fluid = dataclasses.asdict(self.fluid)
        if not self.epsilon_given:
            fluid.pop("epsilon")
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "seed": self.seed,
            "samples": self.samples,
            "max_budget": self.max_budget,
            "workload": {k: v for k, v in w.items() if k != "seed" and v != base[k]},
            "fluid": fluid,
        }
        if self.max_gpus is not None:
            out["max_gpus"] = self.max_gpus
        return out

    @staticmethod
    def parse(data: Any, cluster_gpus: int | None = None) -> TuningAppSpec:
        """Validate a `tuning` block; raises TuningSpecError naming the field."""
        try:
            block = validate_input(TuningBlock, data, "tuning")
        except ScenarioError as e:
            raise TuningSpecError(e.field if e.field != "(top level)" else "", e.problem) from None
        return TuningAppSpec.of(block, cluster_gpus)

    @staticmethod
    def of(block: TuningBlock, cluster_gpus: int | None = None) -> TuningAppSpec:
        """The spec of a validated block; TuningSpecError for what only the cluster or the dataclasses know."""
        if block.max_gpus is not None and cluster_gpus is not None and block.max_gpus > cluster_gpus:
            raise TuningSpecError(
                "max_gpus", f"{block.max_gpus} GPUs asked but the cluster has {cluster_gpus}"
            )
        try:
            workload = build_workload(block.workload)
        except (TypeError, ValueError) as e:
            raise TuningSpecError("workload", str(e)) from None
        try:
            fluid = build_fluid(block.fluid)
        except (TypeError, ValueError) as e:
            raise TuningSpecError("fluid", str(e)) from None
        return TuningAppSpec(
            block.algorithm,
            block.seed,
            block.max_gpus,
            block.samples,
            block.max_budget,
            workload,
            fluid,
            "epsilon" in given(block.fluid),
        )
