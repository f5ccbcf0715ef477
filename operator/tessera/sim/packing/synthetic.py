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
from typing import Any

from tessera.policy.lanes.fragmentation import Shape
from tessera.sim.packing.trace import NodeSpec
from tessera.sim.scenario import ScenarioError


@dataclass(frozen=True)
class PodMix:
    population: int
    shares: tuple[float, float, float, float]  # cpu_only, fractional, whole, multi
    fractional_milli: tuple[int, ...]
    multi_gpus: tuple[int, ...]
    cpu_per_gpu: tuple[float, float]
    memory_per_cpu: tuple[float, float]
    gpu_models: tuple[tuple[str, float], ...]


def _pos_int(v: Any, source: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScenarioError(source, where, f"must be a positive integer, got {v!r}")
    return v


def _range(v: Any, source: str, where: str) -> tuple[float, float]:
    if (
        not isinstance(v, list)
        or len(v) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and x >= 0 for x in v)
        or v[0] > v[1]
    ):
        raise ScenarioError(source, where, f"must be [low, high] with 0 <= low <= high, got {v!r}")
    return float(v[0]), float(v[1])


def load_nodes(data: Any, source: str) -> list[NodeSpec]:
    if not isinstance(data, list) or not data:
        raise ScenarioError(source, "synthetic.nodes", "must be a non-empty list of node groups")
    out: list[NodeSpec] = []
    for i, g in enumerate(data):
        where = f"synthetic.nodes[{i}]"
        if not isinstance(g, dict):
            raise ScenarioError(source, where, "must be a mapping")
        count = _pos_int(g.get("count", 1), source, f"{where}.count")
        gpus = _pos_int(g.get("gpus"), source, f"{where}.gpus")
        cpu = _pos_int(g.get("cpu_milli"), source, f"{where}.cpu_milli")
        mem = _pos_int(g.get("memory_mib"), source, f"{where}.memory_mib")
        model = str(g.get("model", "GPU"))
        if len(out) + count > 100_000:
            raise ScenarioError(source, where, "more than 100000 nodes in all")
        base = len(out)
        out.extend(NodeSpec(f"{model.lower()}-{base + k}", cpu, mem, gpus, model) for k in range(count))
    return out


def load_mix(data: Any, source: str) -> PodMix:
    if not isinstance(data, dict):
        raise ScenarioError(source, "synthetic.pods", "must be a mapping")
    population = _pos_int(data.get("population", 5000), source, "synthetic.pods.population")
    if population > 1_000_000:
        raise ScenarioError(source, "synthetic.pods.population", "must be at most 1000000")
    shares = []
    # defaults: the mix of Alibaba's pod list (13 % CPU-only, 38 % fractional, 48 % one GPU, 1 % multi-GPU)
    for k, default in (("cpu_only", 0.13), ("fractional", 0.38), ("whole", 0.48), ("multi", 0.01)):
        v = data.get(k, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ScenarioError(source, f"synthetic.pods.{k}", f"must be a share >= 0, got {v!r}")
        shares.append(float(v))
    if sum(shares[1:]) <= 0:
        raise ScenarioError(source, "synthetic.pods", "needs a positive share of GPU pods")
    total = sum(shares)
    milli = data.get("fractional_milli", [100, 250, 500, 750])
    if (
        not isinstance(milli, list)
        or not milli
        or not all(isinstance(m, int) and 0 < m < 1000 for m in milli)
    ):
        raise ScenarioError(source, "synthetic.pods.fractional_milli", "must list GPU shares in 1..999 milli")
    multi = data.get("multi_gpus", [2, 4, 8])
    if not isinstance(multi, list) or not multi or not all(isinstance(m, int) and m >= 2 for m in multi):
        raise ScenarioError(source, "synthetic.pods.multi_gpus", "must list GPU counts >= 2")
    models = data.get("gpu_models") or {}
    if not isinstance(models, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in models.values()
    ):
        raise ScenarioError(source, "synthetic.pods.gpu_models", "must map a model to a share in [0, 1]")
    if sum(models.values()) > 1:
        raise ScenarioError(source, "synthetic.pods.gpu_models", "shares must add up to at most 1")
    s = (shares[0] / total, shares[1] / total, shares[2] / total, shares[3] / total)
    return PodMix(
        population,
        s,
        tuple(milli),
        tuple(multi),
        _range(data.get("cpu_per_gpu_milli", [4000, 12000]), source, "synthetic.pods.cpu_per_gpu_milli"),
        _range(data.get("memory_per_cpu_mib", [2048, 4096]), source, "synthetic.pods.memory_per_cpu_mib"),
        tuple((str(k), float(v)) for k, v in models.items()),
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
