"""A synthetic GPU-sharing cluster and pod population from a scenario file (same form as the trace's).

synthetic:
  nodes:                      # node groups
    - {count: 100, gpus: 8, model: V100M32, cpu_milli: 96000, memory_mib: 393216}
  pods:
    population: 5000          # pods in the population sampled from (as the trace's pod list)
    cpu_only: 0.1             # shares of the four kinds (normalised)
    fractional: 0.4
    whole: 0.4
    multi: 0.1
    fractional_milli: [100, 250, 500, 750]   # GPU share choices of fractional pods (uniform)
    multi_gpus: [2, 4, 8]     # GPU counts of multi-GPU pods (uniform)
    cpu_per_gpu_milli: [4000, 12000]   # CPU per GPU asked, uniform in the range (CPU-only: per pod)
    memory_per_cpu_mib: [2048, 4096]   # memory per CPU core asked, uniform in the range
    gpu_models: {V100M32: 0.1}         # share of GPU pods constrained to one model
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, Field, Strict

from tessera.policy.lanes.fragmentation import Shape
from tessera.sim.inputs import Gpus, Input, NonNegative, PositiveInt
from tessera.sim.inputs import validate as validate_input
from tessera.sim.packing.trace import NodeSpec
from tessera.sim.scenario import MAX_GPUS, MAX_MACHINES, ScenarioError


@dataclass(frozen=True)
class PodMix:
    population: int
    shares: tuple[float, float, float, float]  # cpu_only, fractional, whole, multi
    fractional_milli: tuple[int, ...]
    multi_gpus: tuple[int, ...]
    cpu_per_gpu: tuple[float, float]
    memory_per_cpu: tuple[float, float]
    gpu_models: tuple[tuple[str, float], ...]


def _ordered(v: tuple[float, float]) -> tuple[float, float]:
    if v[0] > v[1]:
        raise ValueError(f"must be [low, high] with low <= high, got {list(v)}")
    return v


Range = Annotated[tuple[NonNegative, NonNegative], AfterValidator(_ordered)]
Milli = Annotated[int, Strict(), Field(ge=1, le=999)]
MultiGpus = Annotated[int, Strict(), Field(ge=2, le=MAX_GPUS)]
Share = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]


class NodeGroupInput(Input):
    """`count` nodes of one shape."""

    count: Annotated[int, Strict(), Field(ge=1, le=MAX_MACHINES)] = 1
    gpus: Gpus
    cpu_milli: PositiveInt
    memory_mib: PositiveInt
    model: str = "GPU"


class NodeGroups(Input):
    nodes: Annotated[list[NodeGroupInput], Field(min_length=1)]


class PodMixInput(Input):
    """The pod population; the four shares are normalised. Defaults: the mix of Alibaba's pod list
    (13 % CPU-only, 38 % fractional, 48 % one GPU, 1 % multi-GPU)."""

    population: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = 5000
    cpu_only: NonNegative = 0.13
    fractional: NonNegative = 0.38
    whole: NonNegative = 0.48
    multi: NonNegative = 0.01
    fractional_milli: Annotated[list[Milli], Field(min_length=1)] = Field(
        default_factory=lambda: [100, 250, 500, 750]
    )
    multi_gpus: Annotated[list[MultiGpus], Field(min_length=1)] = Field(default_factory=lambda: [2, 4, 8])
    cpu_per_gpu_milli: Range = (4000.0, 12000.0)
    memory_per_cpu_mib: Range = (2048.0, 4096.0)
    gpu_models: dict[str, Share] = Field(default_factory=dict)
    """Share of GPU pods held to one model."""


class SyntheticInput(Input):
    nodes: Annotated[list[NodeGroupInput], Field(min_length=1)]
    pods: PodMixInput = PodMixInput()


def load_nodes(data: Any, source: str) -> list[NodeSpec]:
    groups = validate_input(NodeGroups, {"nodes": data}, source, "synthetic").nodes
    return nodes_of(groups, source)


def nodes_of(groups: list[NodeGroupInput], source: str) -> list[NodeSpec]:
    out: list[NodeSpec] = []
    for i, g in enumerate(groups):
        if len(out) + g.count > MAX_MACHINES:
            raise ScenarioError(source, f"synthetic.nodes[{i}]", f"more than {MAX_MACHINES} nodes in all")
        base = len(out)
        out.extend(
            NodeSpec(f"{g.model.lower()}-{base + k}", g.cpu_milli, g.memory_mib, g.gpus, g.model)
            for k in range(g.count)
        )
    return out


def load_mix(data: Any, source: str) -> PodMix:
    return mix_of(validate_input(PodMixInput, data, source, "synthetic.pods"), source)


def mix_of(m: PodMixInput, source: str) -> PodMix:
    shares = [m.cpu_only, m.fractional, m.whole, m.multi]
    if sum(shares[1:]) <= 0:
        raise ScenarioError(source, "synthetic.pods", "needs a positive share of GPU pods")
    if sum(m.gpu_models.values()) > 1:
        raise ScenarioError(source, "synthetic.pods.gpu_models", "shares must add up to at most 1")
    total = sum(shares)
    return PodMix(
        m.population,
        (shares[0] / total, shares[1] / total, shares[2] / total, shares[3] / total),
        tuple(m.fractional_milli),
        tuple(m.multi_gpus),
        m.cpu_per_gpu_milli,
        m.memory_per_cpu_mib,
        tuple(m.gpu_models.items()),
    )


def population(mix: PodMix, seed: int) -> list[Shape]:
    """A pod population drawn from `mix` (the synthetic counterpart of the trace's pod list)."""
    rng = random.Random(seed)
    out: list[Shape] = []
    for _ in range(mix.population):
        kind = rng.choices(range(4), weights=mix.shares)[0]
        gpus = (0, 1, 1, rng.choice(mix.multi_gpus))[kind]
        milli = rng.choice(mix.fractional_milli) if kind == 1 else 1000
        cpu = round(rng.uniform(*mix.cpu_per_gpu) * max(gpus * milli / 1000, 1.0 if not gpus else 0.0), -3)
        cpu = max(cpu, 1000.0)
        mem = float(round(cpu / 1000 * rng.uniform(*mix.memory_per_cpu)))
        shape = Shape.share(gpus, milli if gpus else 0, cpu, mem)
        if gpus and mix.gpu_models:
            u, acc = rng.random(), 0.0
            for model, share in mix.gpu_models:
                acc += share
                if u < acc:
                    shape = Shape(
                        gpus, shape.compute, 0.0, shape.gpu_memory_frac, cpu, mem, frozenset({model})
                    )
                    break
        out.append(shape)
    return out
