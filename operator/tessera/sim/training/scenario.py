"""The `training` scenario kind: a cluster, a trace, policies and knobs (see docs/simulate.md).

    kind: training
    name: my-run
    seed: 1
    cluster: {preset: testbed-64}        # or machines: [{count: 8, slots: 1, gpus_per_slot: 2}], machines_per_rack
    trace: {generate: {apps: 200, workload: w2, mean_interarrival_s: 600}}   # or {file: trace.csv}
           # either may add apps in the trace YAML form, e.g. tuning apps run by Fluid inside their lease:
           # trace: {generate: {...}, apps: [{id: tune, arrival: 0, tuning: {algorithm: asha, max_gpus: 8}}]}
    policies: [themis, tiresias, gandiva, optimus, slaq, srtf, srsf, drf]
              # an entry may be a mapping: {policy: themis, label: themis-f0, fairness_knob: 0, lease_s: 300}
              # baselines take lease_s and placement: tight | any | random ({policy: drf, placement: tight})
    themis: {fairness_knob: 0.8, lease_s: 600}   # defaults for every themis entry
    lease_s: 600                                  # baselines' lease (drf never preempts unless given one)
    sim: {restart_s: 30, admission_threshold: null, halving_rule: median}

Every error names the file, the field and what is wrong (tessera.sim.scenario.ScenarioError).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.cluster import Cluster, Sensitivity
from tessera.policy.baselines import BASELINES
from tessera.policy.themis import Themis, ThemisConfig
from tessera.policy.training import TrainingPolicy
from tessera.progress import Progress
from tessera.sim.scenario import MAX_GPUS, MAX_MACHINES, MAX_SECONDS, ScenarioError
from tessera.sim.training.report import TrainingResult
from tessera.sim.training.simulator import SimConfig, SimRun, simulate
from tessera.sim.training.trace import GeneratorConfig, Trace, TraceError, generate, parse_apps, read_trace

PRESETS: dict[str, list[tuple[int, int]]] = {
    # Themis testbed (L1203–L1206): 8 × NC12 (2 GPUs) + 12 × NC24 (4 GPUs) = 64 GPUs on 20 machines.
    "testbed-64": [(1, 2)] * 8 + [(1, 4)] * 12,
}
ALL_POLICIES = ["themis", *BASELINES]
_TOP = {"kind", "name", "seed", "cluster", "trace", "policies", "themis", "lease_s", "sim", "description"}
_THEMIS_KEYS = {f.name for f in dataclasses.fields(ThemisConfig)}


@dataclass(frozen=True, slots=True)
class PolicySpec:
    policy: str
    label: str
    knobs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> TrainingPolicy:
        if self.policy == "themis":
            t = Themis(ThemisConfig(**self.knobs))
            t.name = self.label
            return t
        p = BASELINES[self.policy](**self.knobs)
        p.name = self.label
        return p


@dataclass(frozen=True, slots=True)
class TrainingScenario:
    name: str
    source: str
    seed: int
    cluster: Cluster
    trace: Trace | None  # None: generated from `generator` with the seed
    generator: GeneratorConfig | None
    policies: tuple[PolicySpec, ...]
    sim: SimConfig
    extra_apps: Trace = field(default_factory=Trace)  # `trace.apps`: added to the file or generated trace

    def resolved_trace(self) -> Trace:
        if self.trace is not None:
            base = self.trace
        elif self.generator is not None:
            base = generate(self.generator, random.Random(self.seed), len(self.cluster))
        else:
            base = Trace()
        if not self.extra_apps.apps:
            return base
        ids = {a.id for a in base.apps}
        for a in self.extra_apps.apps:
            if a.id in ids:
                raise ScenarioError(self.source, "trace.apps", f"app id {a.id!r} is already in the trace")
        return Trace(sorted([*base.apps, *self.extra_apps.apps], key=lambda a: (a.arrival, a.id)))


def _mapping(source: str, where: str, v: Any) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ScenarioError(source, where, f"expected a mapping, got {type(v).__name__}")
    return v


def _unknown(source: str, where: str, data: Mapping[str, Any], known: set[str]) -> None:
    for k in data:
        if k not in known:
            raise ScenarioError(
                source,
                f"{where}.{k}" if where else str(k),
                f"unknown field; known: {', '.join(sorted(known))}",
            )


def _cluster(source: str, data: Any) -> Cluster:
    c = _mapping(source, "cluster", data)
    _unknown(source, "cluster", c, {"preset", "machines", "machines_per_rack"})
    mpr = c.get("machines_per_rack", 8)
    if not isinstance(mpr, int) or isinstance(mpr, bool) or mpr < 1:
        raise ScenarioError(source, "cluster.machines_per_rack", f"expected a positive integer, got {mpr!r}")
    if "preset" in c:
        preset = str(c["preset"])
        if preset in PRESETS:
            return Cluster.build(PRESETS[preset], machines_per_rack=mpr)
        if preset in ("themis-168", "themis-256"):
            return Cluster.themis_paper(preset.split("-")[1])
        raise ScenarioError(
            source, "cluster.preset", f"unknown preset {preset!r}; use testbed-64, themis-168 or themis-256"
        )
    ms = c.get("machines")
    if not isinstance(ms, list) or not ms:
        raise ScenarioError(source, "cluster", "needs `preset` or a non-empty `machines` list")
    shapes: list[tuple[int, int]] = []
    for i, m in enumerate(ms):
        mm = _mapping(source, f"cluster.machines[{i}]", m)
        _unknown(source, f"cluster.machines[{i}]", mm, {"count", "slots", "gpus_per_slot"})
        vals = {}
        for k, default in (("count", 1), ("slots", 1), ("gpus_per_slot", None)):
            v = mm.get(k, default)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ScenarioError(
                    source, f"cluster.machines[{i}].{k}", f"expected a positive integer, got {v!r}"
                )
            if v > (MAX_MACHINES if k == "count" else MAX_GPUS):
                cap = MAX_MACHINES if k == "count" else MAX_GPUS
                raise ScenarioError(
                    source,
                    f"cluster.machines[{i}].{k}",
                    f"{v} is more than {cap}, the most a scenario accepts",
                )
            vals[k] = v
        gpus = sum(s * g for s, g in shapes) + vals["count"] * vals["slots"] * vals["gpus_per_slot"]
        if len(shapes) + vals["count"] > MAX_MACHINES or gpus > MAX_GPUS:
            raise ScenarioError(
                source,
                "cluster.machines",
                f"more than {MAX_MACHINES} machines or {MAX_GPUS} GPUs, the most a scenario accepts",
            )
        shapes += [(vals["slots"], vals["gpus_per_slot"])] * vals["count"]
    return Cluster.build(shapes, machines_per_rack=mpr)


def _policies(source: str, data: Mapping[str, Any]) -> tuple[PolicySpec, ...]:
    raw = data.get("policies", ALL_POLICIES)
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(
            source, "policies", f"expected a non-empty list; known: {', '.join(ALL_POLICIES)}"
        )
    themis_defaults = dict(_mapping(source, "themis", data.get("themis", {})))
    _unknown(source, "themis", themis_defaults, _THEMIS_KEYS)
    try:  # validate the shared knobs on their own, so an error names `themis`, not a policy entry
        PolicySpec("themis", "themis", themis_defaults).build()
    except (ValueError, TypeError) as e:
        raise ScenarioError(source, "themis", str(e)) from None
    lease = data.get("lease_s", 600.0)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= MAX_SECONDS:
        raise ScenarioError(source, "lease_s", f"expected a positive number of seconds, got {lease!r}")
    out: list[PolicySpec] = []
    for i, p in enumerate(raw):
        where = f"policies[{i}]"
        entry: dict[str, Any] = {"policy": p} if isinstance(p, str) else dict(_mapping(source, where, p))
        name = entry.pop("policy", None)
        if name not in ALL_POLICIES:
            raise ScenarioError(
                source,
                f"{where}.policy" if not isinstance(p, str) else where,
                f"unknown policy {name!r}; known: {', '.join(ALL_POLICIES)}",
            )
        label = str(entry.pop("label", name))
        knobs: dict[str, Any]
        if name == "themis":
            knobs = {**themis_defaults, **entry}
            _unknown(source, where, knobs, _THEMIS_KEYS)
        else:
            _unknown(source, where, entry, {"lease_s", "placement"})
            default_lease = (
                math.inf if name == "drf" else float(lease)
            )  # drf: never preempts unless given one
            own = entry.get("lease_s", default_lease)
            if own is not default_lease and (
                isinstance(own, bool) or not isinstance(own, (int, float)) or not 0 < own <= MAX_SECONDS
            ):
                raise ScenarioError(
                    source,
                    f"{where}.lease_s",
                    f"expected a positive number of seconds up to {MAX_SECONDS}, got {own!r}",
                )
            knobs = {"lease_s": float(own)}
            if "placement" in entry:  # tight | any | random; default: the paper's rule per baseline
                knobs["placement"] = entry["placement"]
        try:
            spec = PolicySpec(name, label, knobs)
            spec.build()
        except (ValueError, TypeError) as e:
            raise ScenarioError(source, where, str(e)) from None
        out.append(spec)
    labels = [s.label for s in out]
    if len(set(labels)) != len(labels):
        raise ScenarioError(
            source, "policies", f"labels must be unique, got {labels}; add `label:` to repeated policies"
        )
    return tuple(out)


def load(data: dict[str, Any], source: str) -> TrainingScenario:
    """Validate a training scenario mapping (already parsed from YAML at `source`)."""
    d = _mapping(source, "", data)
    _unknown(source, "", d, _TOP)
    seed = d.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ScenarioError(source, "seed", f"expected an integer, got {seed!r}")
    cluster = _cluster(source, d.get("cluster", {"preset": "testbed-64"}))
    t = _mapping(source, "trace", d.get("trace", {"generate": {}}))
    _unknown(source, "trace", t, {"file", "generate", "apps"})
    trace: Trace | None = None
    gen: GeneratorConfig | None = None
    extra = Trace()
    if "apps" in t:
        try:
            extra = parse_apps(source, t["apps"], len(cluster))
        except TraceError as e:
            raise ScenarioError(source, f"trace.{e.field}", e.problem) from None
    if "file" in t:
        path = Path(str(t["file"]))
        if not path.is_absolute():
            path = Path(source).parent / path
        try:
            trace = read_trace(path, len(cluster))
        except TraceError as e:
            raise ScenarioError(source, "trace.file", str(e)) from None
    elif "generate" in t or "apps" not in t:
        g = dict(_mapping(source, "trace.generate", t.get("generate", {})))
        known = {f.name for f in dataclasses.fields(GeneratorConfig)}
        _unknown(source, "trace.generate", g, known)
        if "jobs_per_app" in g:
            g["jobs_per_app"] = tuple(g["jobs_per_app"])
        try:
            gen = GeneratorConfig(**g)
        except (ValueError, TypeError) as e:
            raise ScenarioError(source, "trace.generate", str(e)) from None
    s = dict(_mapping(source, "sim", d.get("sim", {})))
    _unknown(source, "sim", s, {f.name for f in dataclasses.fields(SimConfig)})
    if "reported_sensitivity" in s:  # {app id: {cross_machine: 2.0, ...}}: what a misreporting app claims
        rep = _mapping(source, "sim.reported_sensitivity", s["reported_sensitivity"])
        try:
            s["reported_sensitivity"] = tuple(
                (str(k), Sensitivity(**_mapping(source, f"sim.reported_sensitivity.{k}", v)))
                for k, v in rep.items()
            )
        except (ValueError, TypeError) as e:
            raise ScenarioError(source, "sim.reported_sensitivity", str(e)) from None
    try:
        sim = SimConfig(**s)
    except (ValueError, TypeError) as e:
        raise ScenarioError(source, "sim", str(e)) from None
    return TrainingScenario(
        name=str(d.get("name", Path(source).stem)),
        source=source,
        seed=seed,
        cluster=cluster,
        trace=trace,
        generator=gen,
        extra_apps=extra,
        policies=_policies(source, d),
        sim=sim,
    )


def _run_one(scenario: TrainingScenario, spec: PolicySpec, trace: Trace) -> SimRun:
    return simulate(spec.build(), scenario.cluster, trace, random.Random(scenario.seed), scenario.sim)


def run(scenario: TrainingScenario, *, progress: bool = False, workers: int | None = None) -> TrainingResult:
    """Run every policy of the scenario on the same trace and seed; policies run in parallel processes
    (`workers`, default: up to 2 or the CPU count) since each run is independent."""
    trace = scenario.resolved_trace()
    n = len(scenario.policies)
    bar = Progress(n, f"simulate {scenario.name}", enabled=None if progress else False)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1, n)
    runs: dict[int, SimRun] = {}
    if workers <= 1:
        for i, spec in enumerate(scenario.policies):
            runs[i] = _run_one(scenario, spec, trace)
            bar.update(len(runs), spec.label)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(_run_one, scenario, spec, trace): i for i, spec in enumerate(scenario.policies)
            }
            for fut in as_completed(futures):
                i = futures[fut]
                runs[i] = fut.result()
                bar.update(len(runs), scenario.policies[i].label)
    bar.close()
    meta = {"gpus": len(scenario.cluster), "apps": len(trace.apps), "seed": scenario.seed}
    return TrainingResult(scenario.name, [runs[i] for i in range(n)], meta)
