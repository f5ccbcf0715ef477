"""One TrialGroup of trials with given single-GPU runtimes, for the toy example and the bound checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig, RuntimeModel
from tessera.policy.hpo import GridSearch, TrialRun
from tessera.sim.tuning.engine import Executor, TuningResult, TuningSim


@dataclass(frozen=True, slots=True)
class FixedHeights:
    """Each trial is one iteration whose single-GPU time is its config's `h`."""

    alpha: float = 1.0
    beta: float = 1.0
    gpu_util: float = 1.0
    target: float = float("inf")

    def iteration_time(self, spec: TrialRun) -> float:
        return spec.config["h"]

    def runtime_model(self, spec: TrialRun) -> RuntimeModel:
        return RuntimeModel(self.alpha, self.beta)

    def score(self, spec: TrialRun, iteration: int) -> float:
        return 0.0


def simulate_group(
    h1: Sequence[float],
    n: int,
    config: FluidConfig,
    executor: Executor = "fluid",
    model: FixedHeights | None = None,
) -> TuningResult:
    for h in h1:
        if h <= 0:
            raise ValueError(f"runtimes must be > 0, got {h}")
    cluster = Cluster.homogeneous(1, n)
    alg = GridSearch([{"h": h} for h in h1], budget=1)
    return TuningSim(cluster, cluster.gpu_ids, model or FixedHeights(), alg, executor, config).run()


def run_static_group(h1: Sequence[float], n: int, config: FluidConfig) -> float:
    """Makespan of one TrialGroup under Fluid with no overheads (α = β = 1)."""
    return simulate_group(h1, n, config).makespan
