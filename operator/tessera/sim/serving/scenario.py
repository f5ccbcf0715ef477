"""Scenario kind ``serving`` for ``tessera simulate``: batching policies for one model and Symphony's
multi-GPU dispatch.

Two optional sections (at least one is required):

* ``batching`` — one dynamic model (normal modes, one per application, as in Orloj §5) on one GPU:
  finish rate of Orloj, Clockwork, Nexus, Clipper and timeout batching at several SLO multiples of the
  solo-time P99 (:mod:`tessera.sim.serving.batching_experiment`).
* ``cluster`` — identical static models ℓ(b) = αb + β on several GPUs: bad rate, GPU busy fraction, GPUs
  used and median batch of Symphony, eager dispatch, Shepherd and Clockwork at loads given as fractions of
  the staggered capacity (A.6), and optionally each policy's goodput at a 1 % bad rate and the fewest GPUs
  that serve a given rate (:mod:`tessera.sim.serving.cluster_sim`).

Example: ``tessera/sim/data/serving-default.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from tessera.policy.serving.common import BatchLatencyModel
from tessera.progress import Progress
from tessera.sim.inputs import Bool, Count, Gpus, Input, Positive, Real, Requests, Seconds, Seed, one_of
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import ScenarioError
from tessera.sim.serving.batching_experiment import POLICIES as BATCHING_POLICIES
from tessera.sim.serving.batching_experiment import run_batching
from tessera.sim.serving.cluster_sim import (
    CLUSTER_DEFAULT_POLICIES,
    CLUSTER_POLICIES,
    ClusterStats,
    identical_models,
    max_goodput,
    min_gpus,
    run_policy,
    staggered_capacity,
)
from tessera.sim.serving.dynamic_workload import DynamicModel
from tessera.sim.serving.worker_sim import RunStats


@dataclass(frozen=True)
class BatchingSection:
    modes: int
    sigma: float
    low: float
    high: float
    load: float
    requests: int
    cv: float
    slo_multiples: list[float]
    policies: list[str]
    s0: float
    s1: float


@dataclass(frozen=True)
class ClusterSection:
    models: int
    alpha: float
    beta: float
    slo: float
    gpus: int
    loads: list[float]
    duration: float
    cv: float
    policies: list[str]
    goodput: bool
    min_gpus_rate: float | None
    get_batch: str = "headGreedy"
    target_batch: str = "modelRate"


@dataclass(frozen=True)
class ServingScenario:
    source: str
    name: str
    seed: int
    batching: BatchingSection | None
    cluster: ClusterSection | None


def _policies(allowed: tuple[str, ...], default: tuple[str, ...] | None = None) -> Any:
    """A non-empty list of policy names out of `allowed` (default: `default`, else all of them)."""
    d = allowed if default is None else default
    return Annotated[list[one_of(allowed)], Field(min_length=1, default_factory=lambda: list(d))]  # type: ignore[misc]


PositiveList = Annotated[list[Positive], Field(min_length=1)]


class LatencyInput(Input):
    """l_B(k) = (s0 + s1·k) · the largest solo time."""

    s0: Real = 0.8
    s1: Positive = 0.2


class BatchingInput(Input):
    modes: Count = 2
    low_ms: Positive = 50.0
    high_ms: Positive = 100.0
    sigma_ms: Positive = 5.0
    load: Positive = 0.6
    requests: Requests = 1500
    cv: Positive = 1.0
    slo_multiples: PositiveList = Field(default_factory=lambda: [1.5, 2.0, 3.0, 5.0])
    policies: _policies(BATCHING_POLICIES)  # type: ignore[valid-type]
    latency: LatencyInput = LatencyInput()


class ServingClusterInput(Input):
    models: Count = 4
    alpha_ms: Positive
    beta_ms: Positive
    slo_ms: Positive
    gpus: Gpus
    loads: PositiveList = Field(default_factory=lambda: [0.2, 0.5, 0.8])
    duration_s: Seconds = 2.0
    cv: Positive = 1.0
    policies: _policies(CLUSTER_POLICIES, CLUSTER_DEFAULT_POLICIES)  # type: ignore[valid-type]
    get_batch: Literal["headGreedy", "earlyDropForTarget"] = "headGreedy"
    """GETBATCH of symphony, eager and timeout (Symphony A.5); the *-headgreedy policies ignore it."""
    target_batch: Literal["modelRate", "clusterGpus"] = "modelRate"
    """earlyDropForTarget's target batch: the model's metered rate (the authors' code) or every GPU."""
    goodput: Bool = True
    """Bisection for the highest rate at <= 1 % bad rate."""
    min_gpus_rate: Positive | None = None
    """Fewest GPUs serving this many req/s."""


class ServingFile(Input):
    """A `kind: serving` scenario: a `batching` section, a `cluster` section, or both."""

    kind: Literal["serving"] = "serving"
    name: str | None = None
    description: str | None = None
    seed: Seed = 0
    batching: BatchingInput | None = None
    cluster: ServingClusterInput | None = None


def load(data: dict[str, Any], source: str) -> ServingScenario:
    """Validate a ``kind: serving`` scenario; errors name the file and the field."""
    d = validate_input(ServingFile, data, source)
    if d.batching is None and d.cluster is None:
        raise ScenarioError(
            source, "batching/cluster", "a serving scenario needs at least one of the two sections"
        )
    batching = cluster = None
    if (b := d.batching) is not None:
        if b.high_ms < b.low_ms:
            raise ScenarioError(source, "batching.high_ms", f"must be >= low_ms ({b.low_ms:g})")
        batching = BatchingSection(
            modes=b.modes,
            sigma=b.sigma_ms / 1000,
            low=b.low_ms / 1000,
            high=b.high_ms / 1000,
            load=b.load,
            requests=b.requests,
            cv=b.cv,
            slo_multiples=list(b.slo_multiples),
            policies=list(b.policies),
            s0=b.latency.s0,
            s1=b.latency.s1,
        )
    if (c := d.cluster) is not None:
        cluster = ClusterSection(
            models=c.models,
            alpha=c.alpha_ms / 1000,
            beta=c.beta_ms / 1000,
            slo=c.slo_ms / 1000,
            gpus=c.gpus,
            loads=list(c.loads),
            duration=c.duration_s,
            cv=c.cv,
            policies=list(c.policies),
            goodput=c.goodput,
            min_gpus_rate=c.min_gpus_rate,
            get_batch=c.get_batch,
            target_batch=c.target_batch,
        )
        if cluster.slo <= cluster.alpha + cluster.beta:
            raise ScenarioError(
                source, "cluster.slo_ms", "must exceed the batch-1 latency alpha_ms + beta_ms"
            )
    return ServingScenario(
        source=source,
        name=d.name if d.name is not None else Path(source).stem,
        seed=d.seed,
        batching=batching,
        cluster=cluster,
    )


@dataclass
class ServingResult:
    scenario: ServingScenario
    batching: dict[float, dict[str, RunStats]] = field(default_factory=dict)
    cluster: dict[float, dict[str, ClusterStats]] = field(default_factory=dict)
    capacity: float = 0.0
    goodput: dict[str, float] = field(default_factory=dict)
    min_gpus: dict[str, int | None] = field(default_factory=dict)

    def table(self) -> str:
        sc = self.scenario
        lines: list[str] = []
        if sc.batching is not None:
            bs = sc.batching
            lines.append(
                f"{sc.name} batching: {bs.modes}-mode dynamic model on 1 GPU, load {bs.load:g}, "
                f"{bs.requests} requests; finish rate"
            )
            lines.append(f"{'SLO (xP99)':>10} " + " ".join(f"{p:>10}" for p in bs.policies))
            for mult, row in self.batching.items():
                lines.append(f"{mult:>10g} " + " ".join(f"{row[p].finish_rate:>10.3f}" for p in bs.policies))
        if sc.cluster is not None:
            cs = sc.cluster
            if lines:
                lines.append("")
            lines.append(
                f"{sc.name} cluster: {cs.models} models (alpha {cs.alpha * 1e3:g} ms, beta {cs.beta * 1e3:g} ms, "
                f"SLO {cs.slo * 1e3:g} ms) on {cs.gpus} GPUs; staggered capacity {self.capacity:.0f} req/s"
            )
            lines.append(
                f"{'load':>6} {'policy':<10} {'rate':>8} {'bad rate':>9} {'busy':>6} {'GPUs used':>9} "
                f"{'med batch':>9} {'p99 ms':>7}"
            )
            for frac, crow in self.cluster.items():
                for p in cs.policies:
                    s = crow[p]
                    lines.append(
                        f"{frac:>6g} {p:<10} {frac * self.capacity:>8.0f} {s.bad_rate:>9.4f} "
                        f"{s.busy_fraction:>6.3f} {s.gpus_used:>9d} {s.median_batch:>9g} "
                        f"{s.latency_percentile(99) * 1e3:>7.1f}"
                    )
            if self.goodput:
                ref = self.goodput.get("symphony")
                lines.append("goodput at <= 1% bad rate (req/s): " + ", ".join(
                    f"{p} {g:.0f}" + (f" ({g / ref:.2f}x symphony)" if ref and p != "symphony" else "")
                    for p, g in self.goodput.items()
                ))  # fmt: skip
            if self.min_gpus:
                lines.append(
                    f"fewest GPUs for {cs.min_gpus_rate:g} req/s at <= 1% bad rate: "
                    + ", ".join(
                        f"{p} {n if n is not None else '>' + str(4 * cs.gpus)}"
                        for p, n in self.min_gpus.items()
                    )
                )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "serving", "name": self.scenario.name}
        if self.batching:
            out["batching"] = [
                {
                    "slo_multiple": mult,
                    "policies": {
                        p: {
                            "finish_rate": s.finish_rate,
                            "goodput_rps": s.goodput,
                            "drops": s.drops,
                            "late": s.late,
                            "mean_batch": s.mean_batch,
                            "p50_s": s.latency_percentile(50),
                            "p99_s": s.latency_percentile(99),
                        }
                        for p, s in row.items()
                    },
                }
                for mult, row in self.batching.items()
            ]
        if self.cluster:
            out["cluster"] = {
                "capacity_rps": self.capacity,
                "points": [
                    {
                        "load": frac,
                        "rate_rps": frac * self.capacity,
                        "policies": {
                            p: {
                                "bad_rate": s.bad_rate,
                                "goodput_rps": s.goodput,
                                "busy_fraction": s.busy_fraction,
                                "gpus_used": s.gpus_used,
                                "median_batch": s.median_batch,
                                "p99_s": s.latency_percentile(99),
                                "preempted_batches": s.preempted_batches,
                            }
                            for p, s in row.items()
                        },
                    }
                    for frac, row in self.cluster.items()
                ],
                "goodput_rps": self.goodput,
                "min_gpus": self.min_gpus,
            }
        return out

    def plots(self, directory: Path) -> list[Path]:
        from tessera.sim.plotting import pyplot, save_figure

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        sc = self.scenario
        if sc.batching is not None and self.batching:
            fig, ax = plt.subplots(figsize=(5, 3.5))
            xs = list(self.batching)
            for p in sc.batching.policies:
                ax.plot(xs, [self.batching[x][p].finish_rate for x in xs], marker="o", label=p)
            ax.set_xlabel("SLO (x P99 of solo time)")
            ax.set_ylabel("finish rate")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{sc.name}: {sc.batching.modes}-mode dynamic model")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            paths.append(save_figure(plt, fig, directory / f"{sc.name}-batching.png"))
        if sc.cluster is not None and self.cluster:
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
            xs = list(self.cluster)
            for p in sc.cluster.policies:
                a1.plot(xs, [self.cluster[x][p].busy_fraction for x in xs], marker="o", label=p)
                a2.plot(xs, [self.cluster[x][p].median_batch for x in xs], marker="o", label=p)
            a1.plot(xs, xs, ls="--", color="grey", label="load-proportional")
            a1.set_xlabel("offered load (fraction of staggered capacity)")
            a1.set_ylabel("GPU busy fraction")
            a2.set_xlabel("offered load (fraction of staggered capacity)")
            a2.set_ylabel("median batch size")
            for a in (a1, a2):
                a.grid(alpha=0.3)
            a1.legend(fontsize=8)
            fig.suptitle(f"{sc.name}: {sc.cluster.models} models on {sc.cluster.gpus} GPUs")
            paths.append(save_figure(plt, fig, directory / f"{sc.name}-cluster.png"))
        return paths


def run(scenario: ServingScenario, *, progress: bool = False) -> ServingResult:
    res = ServingResult(scenario)
    b, c = scenario.batching, scenario.cluster
    steps = (len(b.slo_multiples) * len(b.policies) if b else 0) + (
        (len(c.loads) + int(c.goodput) + int(c.min_gpus_rate is not None)) * len(c.policies) if c else 0
    )
    with Progress(steps, f"serving {scenario.name}", enabled=progress or None) as bar:
        done = 0

        def step() -> None:
            nonlocal done
            done += 1
            bar.update(done)

        if b is not None:
            model = DynamicModel.evenly_spaced(
                b.modes, low=b.low, high=b.high, sigma=b.sigma, latency=BatchLatencyModel(s0=b.s0, s1=b.s1)
            )
            res.batching = run_batching(
                model, slo_multiples=b.slo_multiples, n_requests=b.requests, load=b.load,
                seed=scenario.seed, policies=b.policies, cv=b.cv, on_step=step,
            )  # fmt: skip
        if c is not None:
            models = identical_models(c.models, alpha=c.alpha, beta=c.beta, slo=c.slo)
            res.capacity = staggered_capacity(models, c.gpus)
            for frac in c.loads:
                res.cluster[frac] = {}
                for p in c.policies:
                    res.cluster[frac][p] = run_policy(
                        p,
                        models,
                        c.gpus,
                        frac * res.capacity,
                        duration=c.duration,
                        seed=scenario.seed,
                        cv=c.cv,
                        get_batch=c.get_batch,
                        target_batch=c.target_batch,
                    )
                    step()
            if c.goodput:
                for p in c.policies:
                    res.goodput[p] = max_goodput(
                        p, models, c.gpus, duration=c.duration, seed=scenario.seed, cv=c.cv, iters=7,
                        get_batch=c.get_batch, target_batch=c.target_batch,
                    )  # fmt: skip
                    step()
            if c.min_gpus_rate is not None:
                for p in c.policies:
                    res.min_gpus[p] = min_gpus(
                        p, models, c.min_gpus_rate, duration=c.duration, seed=scenario.seed, cv=c.cv,
                        max_gpus=4 * c.gpus, get_batch=c.get_batch, target_batch=c.target_batch,
                    )  # fmt: skip
                    step()
    return res
