"""Scenario kind ``placement`` for ``tessera simulate``: AlpaServe against Selective Replication and
Clockwork++ on a synthetic cluster, optionally sweeping rate, CV or SLO scale (paper §6.2, Fig. 12).

Example: ``tessera/sim/data/placement-default.yaml``. Profiles are synthesised from each model's
single-device latency and size with the α-model (spec §5.4) and marked synthetic in the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tessera.policy.serving.alpaserve import (
    GB,
    GIB,
    ModelProfile,
    SearchOptions,
    all_configs,
    synthetic_profile,
)
from tessera.progress import Progress
from tessera.sim.scenario import (
    MAX_GPUS,
    MAX_NUMBER,
    MAX_SECONDS,
    ScenarioError,
    integer,
    names,
    real,
    section,
)
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


def _num(
    data: dict[str, Any],
    key: str,
    where: str,
    source: str,
    default: float | None = None,
    maximum: float = MAX_NUMBER,
) -> float:
    v = data.get(key, default)
    if v is None:
        raise ScenarioError(source, f"{where}.{key}", "is required")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ScenarioError(source, f"{where}.{key}", f"must be a positive number, got {v!r}")
    if v > maximum:
        raise ScenarioError(
            source, f"{where}.{key}", f"{v!r} is more than {maximum:g}, the most a scenario accepts"
        )
    return float(v)


def load(data: dict[str, Any], source: str) -> PlacementScenario:
    """Validate a ``kind: placement`` scenario; errors name the file and field."""
    cl = section(source, data, "cluster")
    units = cl.get("memory_units", "GB")
    if units not in ("GB", "GiB"):
        raise ScenarioError(source, "cluster.memory_units", f"must be GB or GiB, got {units!r}")
    budget = _num(cl, "memory_budget", "cluster", source, 13) * (GB if units == "GB" else GIB)
    devices = int(_num(cl, "devices", "cluster", source, maximum=MAX_GPUS))
    per_node = int(_num(cl, "devices_per_node", "cluster", source, 8, maximum=MAX_GPUS))
    raw = data.get("models")
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(
            source, "models", "must be a non-empty list of {name, count, latency_ms, size_gb}"
        )
    models = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not m.get("name"):
            raise ScenarioError(source, f"models[{i}].name", "is required")
        models.append(
            ModelSpec(
                str(m["name"]),
                int(_num(m, "count", f"models[{i}]", source, 1, maximum=MAX_GPUS)),
                _num(m, "latency_ms", f"models[{i}]", source) / 1000,
                _num(m, "size_gb", f"models[{i}]", source) * GB,
            )
        )
    wl = section(source, data, "workload")
    policies = names(source, "policies", data.get("policies", list(POLICIES)), POLICIES)
    se = section(source, data, "search")
    try:
        opts = SearchOptions(
            max_pp=int(se.get("max_pp", 8)),
            max_op=int(se.get("max_op", min(4, per_node))),
            devices_per_node=per_node,
            beam_size=int(se.get("beam_size", 1)),
            fast_heuristic=bool(se.get("fast_heuristic", True)),
            bucket_threshold=float(se.get("bucket_threshold", 0.38)),
            memory_rule=se.get("memory_rule", "per_stage"),
        )
    except (TypeError, ValueError) as e:
        raise ScenarioError(source, "search", str(e)) from e
    prof = section(source, data, "profile")
    sweep = data.get("sweep")
    param, values = None, []
    if sweep is not None:
        param = sweep.get("param") if isinstance(sweep, dict) else None
        if param not in SWEEPABLE:
            raise ScenarioError(source, "sweep.param", f"must be one of {list(SWEEPABLE)}, got {param!r}")
        raw_values = sweep.get("values") or []
        if not isinstance(raw_values, list):
            raise ScenarioError(source, "sweep.values", "must be a non-empty list of positive numbers")
        values = [real(source, f"sweep.values[{k}]", v) for k, v in enumerate(raw_values)]
        if not values or any(v <= 0 for v in values):
            raise ScenarioError(source, "sweep.values", "must be a non-empty list of positive numbers")
    return PlacementScenario(
        source=source,
        name=str(data.get("name", Path(source).stem)),
        seed=integer(source, "seed", data.get("seed", 0)),
        devices=devices,
        budget_bytes=budget,
        models=models,
        total_rate=_num(wl, "total_rate", "workload", source),
        cv=_num(wl, "cv", "workload", source, 1.0),
        slo_scale=_num(wl, "slo_scale", "workload", source, 5.0),
        duration_s=_num(wl, "duration_s", "workload", source, 600.0, maximum=MAX_SECONDS),
        rate_exponent=real(source, "workload.rate_exponent", wl.get("rate_exponent", 0.0)),
        policies=list(policies),
        options=opts,
        clockwork_window_s=_num(data, "clockwork_window_s", "scenario", source, 60.0),
        inter_op_overhead=real(source, "profile.inter_op_overhead", prof.get("inter_op_overhead", 0.009)),
        intra_op_comm=real(source, "profile.intra_op_comm", prof.get("intra_op_comm", 0.1)),
        sweep_param=param,
        sweep_values=values,
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
        from tessera.sim.plotting import pyplot

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
        path = directory / f"{self.scenario.name}-attainment.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
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
