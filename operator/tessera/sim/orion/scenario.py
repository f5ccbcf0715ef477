"""Scenario kind ``orion`` for ``tessera simulate``: one GPU shared by an HP client and BE training clients,
under each sharing policy of Orion §6 and Tessera's node policy, on the kernel-level model (`gpu.py`).

Example: ``examples/scenarios/orion-inf-train.yaml``. Kernel mixes are synthetic (see `kernels.py`) and the
output says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, Strict

from tessera.progress import Progress
from tessera.sim.inputs import Bool, Count, Input, Int, Positive, Requests, one_of
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import ScenarioError

from .experiment import ABLATION, POLICIES, Collocation, ExperimentError, ExperimentResult, run_experiment
from .kernels import MODELS


@dataclass(frozen=True)
class OrionScenario:
    source: str
    name: str
    seed: int
    workload: Collocation
    policies: tuple[str, ...]


_KNOWN_POLICIES = POLICIES + tuple(p for p in ABLATION if p not in POLICIES)


def _hp_model(m: str) -> str:
    if not any(k.rsplit("-", 1)[0] == m for k in MODELS):
        raise ValueError(f"unknown model {m!r}; known: {sorted({k.rsplit('-', 1)[0] for k in MODELS})}")
    return m


def _be_model(m: str) -> str:
    if f"{m}-training" not in MODELS:
        raise ValueError(f"no training kernel mix for {m!r}")
    return m


class OrionWorkloadInput(Input):
    hp_model: Annotated[str, AfterValidator(_hp_model)] = "resnet50"
    hp_role: Literal["inference", "training"] = "inference"
    be_models: Annotated[list[Annotated[str, AfterValidator(_be_model)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["resnet50"]
    )
    rate_rps: Positive = 15.0
    """HP requests per second."""
    arrival: Literal["poisson", "uniform"] = "poisson"
    requests: Requests = 400
    warmup_requests: Requests = 20
    num_sms: Count = 80


class OrionPolicyInput(Input):
    dur_threshold: Positive = 0.025
    """Share of the HP request latency (Orion's default)."""
    sm_threshold: Count | None = None
    be_percent: Annotated[int, Strict(), Field(ge=1, le=100)] | None = None
    """BE MPS active-thread percentage; left out, it comes from the HP profile."""
    tessera_priority: Bool = True


class OrionFile(Input):
    """A `kind: orion` scenario."""

    kind: Literal["orion"] = "orion"
    name: str | None = None
    description: str | None = None
    seed: Int = 0
    workload: OrionWorkloadInput = OrionWorkloadInput()
    policy: OrionPolicyInput = OrionPolicyInput()
    policies: Annotated[
        list[one_of(_KNOWN_POLICIES)],  # type: ignore[valid-type]
        Field(min_length=1, default_factory=lambda: list(POLICIES)),
    ]


def load(data: dict[str, Any], source: str) -> OrionScenario:
    """Validate a ``kind: orion`` scenario; errors name the file and field."""
    d = validate_input(OrionFile, data, source)
    wl, pol = d.workload, d.policy
    if f"{wl.hp_model}-{wl.hp_role}" not in MODELS:
        raise ScenarioError(source, "workload.hp_model", f"no {wl.hp_role} kernel mix for {wl.hp_model!r}")
    try:
        w = Collocation(
            hp_model=wl.hp_model,
            hp_role=wl.hp_role,
            be_models=tuple(wl.be_models),
            rate_rps=wl.rate_rps,
            arrival=wl.arrival,
            requests=wl.requests,
            warmup_requests=wl.warmup_requests,
            num_sms=wl.num_sms,
            seed=d.seed,
            dur_threshold=pol.dur_threshold,
            sm_threshold=pol.sm_threshold,
            be_percent=pol.be_percent,
            tessera_priority=pol.tessera_priority,
        )
    except ExperimentError as e:
        raise ScenarioError(source, "workload", str(e)) from None
    name = d.name if d.name is not None else Path(source).stem
    return OrionScenario(source, name, d.seed, w, tuple(d.policies))


@dataclass
class OrionResult:
    scenario: OrionScenario
    experiment: ExperimentResult

    def table(self) -> str:
        w, ex = self.scenario.workload, self.experiment
        lines = [
            f"{self.scenario.name}: HP {w.hp_model} {w.hp_role}"
            + (f" ({w.arrival} {w.rate_rps:g} rps)" if w.hp_role == "inference" else " (closed loop)")
            + ", "
            f"BE {', '.join(w.be_models)} training; {w.num_sms} SMs; SYNTHETIC kernel mixes (Table 1-shaped)",
            f"dedicated HP p99 {ex.hp_latency_dedicated * 1e3:.2f} ms; dedicated BE "
            + ", ".join(f"{x:.2f} it/s" for x in ex.be_dedicated)
            + f"; Tessera BE cap {ex.be_percent}%",
            f"{'policy':<15} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'p99/ideal':>9} {'BE it/s':>8} "
            f"{'BE/ded':>7} {'saving':>7} {'SM util':>7}",
        ]
        for r in ex.results.values():
            be = sum(r.be_throughput)
            lines.append(
                f"{r.policy:<15} {r.hp_p50 * 1e3:>8.2f} {r.hp_p95 * 1e3:>8.2f} {r.hp_p99 * 1e3:>8.2f} "
                f"{r.ratio_p99:>9.2f} {be:>8.2f} {r.be_ratio:>7.2f} {r.cost_saving:>7.2f} {r.sm_util:>7.2f}"
            )
        lines.append(
            "saving = 2·BE collocated / BE dedicated (Orion §6.2); p99/ideal = HP p99 / dedicated p99"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        ex = self.experiment
        return {
            "kind": "orion",
            "name": self.scenario.name,
            "synthetic_kernels": True,
            "hp_p99_dedicated_s": ex.hp_latency_dedicated,
            "be_dedicated_its": ex.be_dedicated,
            "be_percent": ex.be_percent,
            "policies": [r.to_json() for r in ex.results.values()],
        }

    def plots(self, directory: Path) -> list[Path]:
        from tessera.sim.plotting import pyplot, save_figure

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        rs = list(self.experiment.results.values())
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar([r.policy for r in rs], [r.ratio_p99 for r in rs])
        ax.axhline(1.25, color="grey", ls="--", lw=1)
        ax.set_ylabel("HP p99 / dedicated")
        ax.set_title(self.scenario.name)
        ax.tick_params(axis="x", rotation=30)
        path = save_figure(plt, fig, directory / f"{self.scenario.name}-p99.png")
        return [path]


def run(scenario: OrionScenario, *, progress: bool = False) -> OrionResult:
    w = replace(scenario.workload, seed=scenario.seed)
    with Progress(1, f"orion {scenario.name}", enabled=progress or None) as bar:
        ex = run_experiment(w, scenario.policies)
        bar.update(1)
    return OrionResult(scenario, ex)
