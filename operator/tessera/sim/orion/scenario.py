"""Scenario kind ``orion`` for ``tessera simulate``: one GPU shared by an HP client and BE training clients,
under each sharing policy of Orion §6 and Tessera's node policy, on the kernel-level model (`gpu.py`).

Example: ``examples/scenarios/orion-inf-train.yaml``. Kernel mixes are synthetic (see `kernels.py`) and the
output says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tessera.progress import Progress
from tessera.sim.scenario import ScenarioError

from .experiment import ABLATION, POLICIES, ExperimentError, ExperimentResult, Workload, run_experiment
from .kernels import MODELS


@dataclass(frozen=True)
class OrionScenario:
    source: str
    name: str
    seed: int
    workload: Workload
    policies: tuple[str, ...]


def _num(
    d: dict[str, Any], key: str, source: str, where: str, default: float, *, integer: bool = False
) -> Any:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ScenarioError(source, f"{where}.{key}", f"must be a positive number, got {v!r}")
    if integer and int(v) != v:
        raise ScenarioError(source, f"{where}.{key}", f"must be an integer, got {v!r}")
    return int(v) if integer else float(v)


def load(data: dict[str, Any], source: str) -> OrionScenario:
    wl = data.get("workload") or {}
    pol = data.get("policy") or {}
    if not isinstance(wl, dict) or not isinstance(pol, dict):
        raise ScenarioError(source, "workload", "workload and policy must be mappings")
    hp_role = wl.get("hp_role", "inference")
    if hp_role not in ("inference", "training"):
        raise ScenarioError(source, "workload.hp_role", f"must be inference or training, got {hp_role!r}")
    hp_model = str(wl.get("hp_model", "resnet50"))
    if f"{hp_model}-{hp_role}" not in MODELS:
        known = sorted({k.rsplit("-", 1)[0] for k in MODELS})
        raise ScenarioError(source, "workload.hp_model", f"unknown model {hp_model!r}; known: {known}")
    be = wl.get("be_models", ["resnet50"])
    if not isinstance(be, list) or not be:
        raise ScenarioError(source, "workload.be_models", "must be a non-empty list of model names")
    for i, m in enumerate(be):
        if f"{m}-training" not in MODELS:
            raise ScenarioError(source, f"workload.be_models[{i}]", f"no training kernel mix for {m!r}")
    arrival = wl.get("arrival", "poisson")
    if arrival not in ("poisson", "uniform"):
        raise ScenarioError(source, "workload.arrival", f"must be poisson or uniform, got {arrival!r}")
    policies = tuple(data.get("policies") or POLICIES)
    known_p = POLICIES + tuple(p for p in ABLATION if p not in POLICIES)
    bad = [p for p in policies if p not in known_p]
    if bad:
        raise ScenarioError(source, "policies", f"unknown {bad}; choose from {list(known_p)}")
    sm_thr = pol.get("sm_threshold")
    be_pct = pol.get("be_percent")
    if be_pct is not None and (not isinstance(be_pct, int) or not 1 <= be_pct <= 100):
        raise ScenarioError(source, "policy.be_percent", f"must be an integer in 1..100, got {be_pct!r}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise ScenarioError(source, "seed", f"must be an integer, got {seed!r}")
    try:
        w = Workload(
            hp_model=hp_model,
            hp_role=hp_role,
            be_models=tuple(str(m) for m in be),
            rate_rps=_num(wl, "rate_rps", source, "workload", 15.0),
            arrival=arrival,
            requests=_num(wl, "requests", source, "workload", 400, integer=True),
            warmup_requests=_num(wl, "warmup_requests", source, "workload", 20, integer=True),
            num_sms=_num(wl, "num_sms", source, "workload", 80, integer=True),
            seed=seed,
            dur_threshold=_num(pol, "dur_threshold", source, "policy", 0.025),
            sm_threshold=None
            if sm_thr is None
            else _num(pol, "sm_threshold", source, "policy", 80, integer=True),
            be_percent=be_pct,
            tessera_priority=bool(pol.get("tessera_priority", True)),
        )
    except ExperimentError as e:
        raise ScenarioError(source, "workload", str(e)) from None
    return OrionScenario(source, str(data.get("name", Path(source).stem)), seed, w, policies)


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
        from tessera.sim.plotting import pyplot

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        rs = list(self.experiment.results.values())
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar([r.policy for r in rs], [r.ratio_p99 for r in rs])
        ax.axhline(1.25, color="grey", ls="--", lw=1)
        ax.set_ylabel("HP p99 / dedicated")
        ax.set_title(self.scenario.name)
        ax.tick_params(axis="x", rotation=30)
        path = directory / f"{self.scenario.name}-p99.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return [path]


def run(scenario: OrionScenario, *, progress: bool = False) -> OrionResult:
    w = replace(scenario.workload, seed=scenario.seed)
    with Progress(1, f"orion {scenario.name}", enabled=progress or None) as bar:
        ex = run_experiment(w, scenario.policies)
        bar.update(1)
    return OrionResult(scenario, ex)
