"""Scenario kind ``placement`` for ``tessera simulate``: AlpaServe against Selective Replication and
Clockwork++ on a synthetic cluster, optionally sweeping rate, CV or SLO scale (paper §6.2, Fig. 12).

Example: ``tessera/sim/data/placement-default.yaml``. Profiles are synthesised from each model's
single-device latency and size with the α-model (AlpaServe §3.3) and marked synthetic in the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, Strict

from tessera.policy.serving.alpaserve import (
    GB,
    GIB,
    MemoryRule,
    ModelProfile,
    SearchOptions,
    all_configs,
    synthetic_profile,
)
from tessera.progress import Progress
from tessera.sim.inputs import Bool, Gpus, Input, Positive, Real, Seconds, Seed, one_of
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import ScenarioError
from tessera.sim.serving.placement_sim import (
    POLICIES,
    PolicyReport,
    gamma_workload,
    power_law_rates,
    run_policies,
)

SWEEPABLE = ("total_rate", "cv", "slo_scale")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    count: int
    latency_s: float
    size_bytes: float


@dataclass(frozen=True)
class PlacementScenario:
    source: str
    name: str
    seed: int
    devices: int
    budget_bytes: float
    models: list[ModelSpec]
    total_rate: float
    cv: float
    slo_scale: float
    duration_s: float
    rate_exponent: float
    policies: list[str]
    options: SearchOptions
    clockwork_window_s: float
    inter_op_overhead: float
    intra_op_comm: float
    sweep_param: str | None = None
    sweep_values: list[float] = field(default_factory=list)


SearchSize = Annotated[int, Strict(), Field(ge=1, le=1024)]


class PlacementClusterInput(Input):
    devices: Gpus
    devices_per_node: Gpus = 8
    memory_budget: Positive = 13.0
    """Memory per device, in memory_units."""
    memory_units: Literal["GB", "GiB"] = "GB"


class ModelInput(Input):
    """`count` copies of a model with this single-device latency and size."""

    name: Annotated[str, Field(min_length=1)]
    count: Gpus = 1
    latency_ms: Positive
    size_gb: Positive


class PlacementWorkloadInput(Input):
    total_rate: Positive
    """Requests per second over all models."""
    cv: Positive = 1.0
    slo_scale: Positive = 5.0
    """SLO = this × each model's single-device latency."""
    duration_s: Seconds = 600.0
    rate_exponent: Real = 0.0
    """Power-law skew of the per-model rates (0: equal)."""


class SearchInput(Input):
    max_pp: SearchSize = 8
    max_op: SearchSize | None = None
    """Default: min(4, devices_per_node)."""
    beam_size: SearchSize = 1
    fast_heuristic: Bool = True
    bucket_threshold: Real = 0.38
    memory_rule: MemoryRule = "per_stage"


class ProfileInput(Input):
    inter_op_overhead: Real = 0.009
    intra_op_comm: Real = 0.1


class SweepInput(Input):
    param: Literal["total_rate", "cv", "slo_scale"]
    values: Annotated[list[Positive], Field(min_length=1)]


class PlacementFile(Input):
    """A `kind: placement` scenario."""

    kind: Literal["placement"] = "placement"
    name: str | None = None
    description: str | None = None
    seed: Seed = 0
    cluster: PlacementClusterInput
    models: Annotated[list[ModelInput], Field(min_length=1)]
    workload: PlacementWorkloadInput
    search: SearchInput = SearchInput()
    profile: ProfileInput = ProfileInput()
    policies: Annotated[
        list[one_of(POLICIES)],  # type: ignore[valid-type]
        Field(min_length=1, default_factory=lambda: list(POLICIES)),
    ]
    clockwork_window_s: Positive = 60.0
    sweep: SweepInput | None = None


def load(data: dict[str, Any], source: str) -> PlacementScenario:
    """Validate a ``kind: placement`` scenario; errors name the file and field."""
    d = validate_input(PlacementFile, data, source)
    cl, wl, se = d.cluster, d.workload, d.search
    try:
        opts = SearchOptions(
            max_pp=se.max_pp,
            max_op=se.max_op if se.max_op is not None else min(4, cl.devices_per_node),
            devices_per_node=cl.devices_per_node,
            beam_size=se.beam_size,
            fast_heuristic=se.fast_heuristic,
            bucket_threshold=se.bucket_threshold,
            memory_rule=se.memory_rule,
        )
    except (TypeError, ValueError) as e:
        raise ScenarioError(source, "search", str(e)) from e
    return PlacementScenario(
        source=source,
        name=d.name if d.name is not None else Path(source).stem,
        seed=d.seed,
        devices=cl.devices,
        budget_bytes=cl.memory_budget * (GB if cl.memory_units == "GB" else GIB),
        models=[ModelSpec(m.name, m.count, m.latency_ms / 1000, m.size_gb * GB) for m in d.models],
        total_rate=wl.total_rate,
        cv=wl.cv,
        slo_scale=wl.slo_scale,
        duration_s=wl.duration_s,
        rate_exponent=wl.rate_exponent,
        policies=list(d.policies),
        options=opts,
        clockwork_window_s=d.clockwork_window_s,
        inter_op_overhead=d.profile.inter_op_overhead,
        intra_op_comm=d.profile.intra_op_comm,
        sweep_param=d.sweep.param if d.sweep is not None else None,
        sweep_values=list(d.sweep.values) if d.sweep is not None else [],
    )


def build_profiles(sc: PlacementScenario) -> list[ModelProfile]:
    cfgs = all_configs(sc.options.max_pp, sc.options.max_op)
    out = []
    for spec in sc.models:
        for i in range(spec.count):
            name = spec.name if spec.count == 1 else f"{spec.name}-{i}"
            out.append(
                synthetic_profile(
                    name, spec.latency_s, spec.size_bytes, cfgs,
                    inter_op_overhead=sc.inter_op_overhead, intra_op_comm=sc.intra_op_comm,
                )
            )  # fmt: skip
    return out


@dataclass
class PlacementResult:
    scenario: PlacementScenario
    points: list[tuple[float | None, list[PolicyReport]]]

    def table(self) -> str:
        sc = self.scenario
        head = f"{sc.name}: {sc.devices} GPUs, {sum(m.count for m in sc.models)} models (synthetic profiles)"
        col = sc.sweep_param or "-"
        lines = [head, f"{col:>10} {'policy':<22} {'SLO att.':>8} {'goodput':>8} {'GPUs':>5} "
                       f"{'mean s':>7} {'p50 s':>7} {'p99 s':>7} {'search s':>8}"]  # fmt: skip
        for x, reps in self.points:
            for r in reps:
                xs = f"{x:g}" if x is not None else "-"
                lines.append(
                    f"{xs:>10} {r.policy:<22} {r.attainment:>8.4f} {r.goodput_rps:>8.2f} {r.gpus_used:>5d} "
                    f"{r.mean_latency_s:>7.3f} {r.p50_s:>7.3f} {r.p99_s:>7.3f} {r.search_s:>8.2f}"
                )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "placement",
            "name": self.scenario.name,
            "synthetic_profiles": True,
            "sweep": self.scenario.sweep_param,
            "points": [{"x": x, "policies": [r.to_json() for r in reps]} for x, reps in self.points],
        }

    def plots(self, directory: Path) -> list[Path]:
        from tessera.sim.plotting import pyplot, save_figure

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        xs = [x if x is not None else i for i, (x, _) in enumerate(self.points)]
        for pi, policy in enumerate(self.scenario.policies):
            ys = [reps[pi].attainment * 100 for _, reps in self.points]
            ax.plot(xs, ys, marker="o", label=policy)
        ax.set_xlabel(self.scenario.sweep_param or "run")
        ax.set_ylabel("SLO attainment (%)")
        ax.set_title(self.scenario.name)
        ax.grid(alpha=0.3)
        ax.legend()
        path = save_figure(plt, fig, directory / f"{self.scenario.name}-attainment.png")
        return [path]


def run_point(sc: PlacementScenario, progress: Progress | None = None) -> list[PolicyReport]:
    profiles = build_profiles(sc)
    names = [p.name for p in profiles]
    rates = power_law_rates(names, sc.total_rate, sc.rate_exponent)
    slo = {p.name: sc.slo_scale * p.latency_s for p in profiles}
    plan = gamma_workload(rates, sc.cv, sc.duration_s, slo, np.random.default_rng(sc.seed))
    evalw = gamma_workload(rates, sc.cv, sc.duration_s, slo, np.random.default_rng(sc.seed + 1))
    return run_policies(
        profiles, sc.devices, plan, evalw, sc.budget_bytes,
        policies=sc.policies, options=sc.options, clockwork_window_s=sc.clockwork_window_s,
    )  # fmt: skip


def _with(sc: PlacementScenario, param: str | None, x: float | None) -> PlacementScenario:
    if x is None or param is None:
        return sc
    if param == "total_rate":
        return replace(sc, total_rate=x)
    if param == "cv":
        return replace(sc, cv=x)
    return replace(sc, slo_scale=x)


def run(scenario: PlacementScenario, *, progress: bool = False) -> PlacementResult:
    xs: list[float | None] = list(scenario.sweep_values) if scenario.sweep_param else [None]
    points = []
    with Progress(len(xs), f"placement {scenario.name}", enabled=progress or None) as bar:
        for i, x in enumerate(xs):
            sc = _with(scenario, scenario.sweep_param, x)
            points.append((x, run_point(sc)))
            bar.update(i + 1)
    return PlacementResult(scenario, points)


def main(argv: list[str] | None = None) -> int:
    """``python -m tessera.sim.serving.placement_scenario FILE [--sweep cv=1,3,5] [--plots DIR]``."""
    import argparse
    import json

    import yaml

    ap = argparse.ArgumentParser(description="Run a placement scenario (AlpaServe vs baselines).")
    ap.add_argument("file", type=Path)
    ap.add_argument("--sweep", help="override the sweep, e.g. cv=1,3,5 or slo_scale=1,2.5,5,10")
    ap.add_argument("--plots", type=Path, help="directory for PNG plots")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    data = yaml.safe_load(args.file.read_text())
    if args.sweep:
        param, _, vals = args.sweep.partition("=")
        data["sweep"] = {"param": param, "values": [float(v) for v in vals.split(",") if v]}
        data["name"] = f"{data.get('name', args.file.stem)}-{param}"
    res = run(load(data, str(args.file)), progress=True)
    print(json.dumps(res.to_json(), indent=1) if args.json else res.table())
    if args.plots:
        for p in res.plots(args.plots):
            print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
