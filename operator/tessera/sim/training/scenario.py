"""The `training` scenario kind: a cluster, a trace, policies and knobs (see docs/simulate.md).

    kind: training
    name: my-run
    seed: 1
    cluster: {preset: testbed-64}        # or machines: [{count: 8, slots: 1, gpus_per_slot: 2}], machines_per_rack
    trace: {generate: {apps: 200, workload: w2, mean_interarrival_s: 600}}   # or {file: trace.csv}
           # either may add apps in the trace YAML form, e.g. tuning apps run by Fluid inside their lease:
           # trace: {generate: {...}, apps: [{id: tune, arrival: 0, tuning: {algorithm: asha, max_gpus: 8}}]}
    policies: [themis, tiresias, gandiva, optimus, slaq, srtf, srsf, drf]   # with queues: also kai-style, kueue-style
              # an entry may be a mapping: {policy: themis, label: themis-f0, fairness_knob: 0, lease_s: 300}
              # baselines take lease_s and placement: tight | any | random ({policy: drf, placement: tight})
    themis: {fairness_knob: 0.8, lease_s: 600}   # defaults for every themis entry
    lease_s: 600                                  # baselines' lease (drf never preempts unless given one)
    sim: {restart_s: 30, admission_threshold: null, halving_rule: median}
    queues:                                       # team queues; apps name theirs (`queue:`), else `default`
      - {name: team-a, guaranteed: 16, max: 48, lending_limit: 8, weight: 1, reclaim: atLeaseEnd, min_runtime_s: 0}

Every error names the file, the field and what is wrong (tessera.sim.scenario.ScenarioError).
"""

from __future__ import annotations

import math
import os
import random
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BeforeValidator, Field, create_model

from tessera.cluster import Cluster, Sensitivity
from tessera.policy.baselines import BASELINES
from tessera.policy.queues import QueueNode, ReclaimRule
from tessera.policy.queues.kai import kai_style
from tessera.policy.queues.kueue import KueueStyle
from tessera.policy.queues.training import QueuedPolicy, with_default
from tessera.policy.themis import Themis, ThemisConfig
from tessera.policy.training import TrainingPolicy
from tessera.progress import Progress
from tessera.sim.inputs import (
    Apps,
    Gpus,
    Input,
    Int,
    Machines,
    NonNegative,
    Positive,
    PositiveInt,
    Seconds,
    Trials,
    given,
    mirror,
    one_of,
)
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import MAX_GPUS, MAX_MACHINES, ScenarioError
from tessera.sim.training.queues import QueueMeter, figures
from tessera.sim.training.report import TrainingResult
from tessera.sim.training.simulator import SimConfig, SimRun, simulate
from tessera.sim.training.trace import (
    AppInput,
    GeneratorConfig,
    SensitivityInput,
    Trace,
    TraceError,
    build_trace,
    generate,
    read_trace,
)

PRESETS: dict[str, list[tuple[int, int]]] = {
    # Themis testbed (§6.1): 8 × NC12 (2 GPUs) + 12 × NC24 (4 GPUs) = 64 GPUs on 20 machines.
    "testbed-64": [(1, 2)] * 8 + [(1, 4)] * 12,
}
ALL_POLICIES = ["themis", *BASELINES]
QUEUE_BASELINES = ["kai-style", "kueue-style"]  # team-queue schedulers (need a `queues:` block)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    policy: str
    label: str
    knobs: dict[str, Any] = field(default_factory=dict)
    queues: tuple[QueueNode, ...] = ()  # team queues: the policy runs inside each queue's share
    rules: tuple[tuple[str, ReclaimRule], ...] = ()

    def build(self) -> TrainingPolicy:
        if self.policy == "kai-style":
            kai = kai_style(self.queues, {n: r.min_runtime_s for n, r in self.rules})
            kai.name = self.label
            return kai
        if self.policy == "kueue-style":
            kueue = KueueStyle(self.queues, **self.knobs)
            kueue.name = self.label
            return kueue
        inner: TrainingPolicy
        if self.policy == "themis":
            t = Themis(ThemisConfig(**self.knobs))
            t.name = self.label
            inner = t
        else:
            p = BASELINES[self.policy](**self.knobs)
            p.name = self.label
            inner = p
        if not self.queues:
            return inner
        return QueuedPolicy(inner, self.queues, dict(self.rules), name=self.label)


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
    queues: tuple[QueueNode, ...] = ()

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


def _named(v: Any) -> Any:
    """`themis` in a policy list is short for `{policy: themis}`."""
    return {"policy": v} if isinstance(v, str) else v


ThemisInput = mirror(ThemisConfig, lease_s=Seconds)
GeneratorInput = mirror(GeneratorConfig, apps=Apps, jobs_per_app=tuple[Trials, Trials])
SimInput = mirror(SimConfig, reported_sensitivity=(dict[str, SensitivityInput], {}))
# A policy entry: a baseline takes lease_s and placement; themis any ThemisConfig knob.
_ENTRY_FIELDS: dict[str, Any] = {
    "policy": (one_of(tuple(ALL_POLICIES + QUEUE_BASELINES)), ...),
    "label": (str | None, None),
    "lease_s": (Seconds | None, None),
    "placement": (str | None, None),
    # kueue-style only (Kueue's ClusterQueue fields; defaults: StrictFIFO, Any — see policy/queues/kueue.py)
    "queueing_strategy": (Literal["BestEffortFIFO", "StrictFIFO"] | None, None),
    "reclaim_within_cohort": (Literal["Never", "Any"] | None, None),
    **{k: (Optional[v.annotation], None) for k, v in ThemisInput.model_fields.items() if k != "lease_s"},  # noqa: UP045
}
PolicyEntry = create_model("PolicyEntry", __base__=Input, **_ENTRY_FIELDS)
_BASELINE_KEYS = {"policy", "label", "lease_s", "placement"}
_KUEUE_KEYS = {"queueing_strategy", "reclaim_within_cohort"}


class QueueInput(Input):
    """One team queue (the Queue kind's fields, tessera.api.queue)."""

    name: str
    guaranteed: NonNegative = 0.0
    max: NonNegative | None = None
    lending_limit: NonNegative | None = None
    """Most of the unused guarantee other queues may borrow (the rest stays reserved); unset: all of it."""
    weight: Positive = 1.0
    parent: str | None = None
    reclaim: Literal["atLeaseEnd", "immediate"] = "atLeaseEnd"
    min_runtime_s: NonNegative = 0.0
    grace_s: NonNegative = 30.0
    reclaim_within_cohort: Literal["Any", "LowerPriority", "Never"] = "Any"
    """What this queue may take from `immediate` lenders before their leases end: any holding, only
    those of lower priority than its highest-priority waiting app, or none (it waits for leases to end)."""
    within_queue: Literal["Never", "LowerPriority"] = "Never"
    """LowerPriority: its higher-priority apps take GPUs from its lower-priority ones at once (after
    `min_runtime_s`); Never: as their leases end."""
    borrow_within_cohort: Literal["Never", "LowerPriority"] = "Never"
    """LowerPriority: above its guarantee it takes the rest of its share at once from `immediate` queues
    above theirs, holdings of lower priority than its highest-priority waiting app only (Kueue's
    borrowWithinCohort); Never: as their leases end."""
    borrow_max_priority_threshold: Int | None = None
    """With borrow_within_cohort LowerPriority: only holdings of at most this priority are taken."""


class MachinesInput(Input):
    count: Machines = 1
    slots: Gpus = 1
    gpus_per_slot: Gpus


class ClusterInput(Input):
    """`preset` (testbed-64, themis-168, themis-256) or a `machines` list."""

    preset: str | None = None
    machines: Annotated[list[MachinesInput], Field(min_length=1)] | None = None
    machines_per_rack: PositiveInt = 8


class TraceInput(Input):
    """`file` (CSV or YAML) or `generate` (the synthetic workload); `apps` add to either."""

    file: str | None = None
    generate: GeneratorInput | None = None  # type: ignore[valid-type]
    apps: list[AppInput] | None = None


class TrainingFile(Input):
    """A `kind: training` scenario."""

    kind: Literal["training"] = "training"
    name: str | None = None
    description: str | None = None
    seed: Int = 1
    cluster: ClusterInput = ClusterInput(preset="testbed-64")
    trace: TraceInput = TraceInput(generate=GeneratorInput())
    policies: Annotated[
        list[Annotated[PolicyEntry, BeforeValidator(_named, json_schema_input_type=str | PolicyEntry)]],
        Field(min_length=1, default_factory=lambda: [PolicyEntry(policy=p) for p in ALL_POLICIES]),
    ]
    themis: ThemisInput = ThemisInput()  # type: ignore[valid-type]
    lease_s: Seconds = 600.0
    """Baselines' lease (drf never preempts unless given one)."""
    sim: SimInput = SimInput()  # type: ignore[valid-type]
    queues: list[QueueInput] | None = None


def _queues(
    source: str, d: TrainingFile
) -> tuple[tuple[QueueNode, ...], tuple[tuple[str, ReclaimRule], ...]]:
    """The `queues:` block as division nodes and reclaim rules; problems name the field."""
    if not d.queues:
        return (), ()
    from tessera.policy.queues import DivisionError, children_of

    nodes, rules = [], []
    for i, q in enumerate(d.queues):
        if q.max is not None and q.max < q.guaranteed:
            raise ScenarioError(source, f"queues[{i}].max", "must be >= guaranteed")
        if q.lending_limit is not None and q.lending_limit > q.guaranteed:
            raise ScenarioError(source, f"queues[{i}].lending_limit", "must be <= guaranteed")
        nodes.append(
            QueueNode(
                q.name,
                q.guaranteed,
                math.inf if q.max is None else q.max,
                q.weight,
                q.parent,
                math.inf if q.lending_limit is None else q.lending_limit,
            )
        )
        rules.append(
            (
                q.name,
                ReclaimRule(
                    q.reclaim,
                    q.min_runtime_s,
                    q.grace_s,
                    q.reclaim_within_cohort,
                    q.within_queue,
                    q.borrow_within_cohort,
                    q.borrow_max_priority_threshold,
                ),
            )
        )
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ScenarioError(source, "queues", f"queue names must be unique, got {names}")
    try:
        children_of(nodes)
    except DivisionError as e:
        raise ScenarioError(source, "queues", str(e)) from None
    return tuple(nodes), tuple(rules)


def _cluster(source: str, c: ClusterInput) -> Cluster:
    if c.preset is not None:
        if c.preset in PRESETS:
            return Cluster.build(PRESETS[c.preset], machines_per_rack=c.machines_per_rack)
        if c.preset in ("themis-168", "themis-256"):
            return Cluster.themis_paper(c.preset.split("-")[1])
        raise ScenarioError(
            source, "cluster.preset", f"unknown preset {c.preset!r}; use testbed-64, themis-168 or themis-256"
        )
    if c.machines is None:
        raise ScenarioError(source, "cluster", "needs `preset` or a non-empty `machines` list")
    machines = sum(m.count for m in c.machines)
    gpus = sum(m.count * m.slots * m.gpus_per_slot for m in c.machines)
    if machines > MAX_MACHINES or gpus > MAX_GPUS:
        raise ScenarioError(
            source,
            "cluster.machines",
            f"more than {MAX_MACHINES} machines or {MAX_GPUS} GPUs, the most a scenario accepts",
        )
    shapes = [(m.slots, m.gpus_per_slot) for m in c.machines for _ in range(m.count)]
    return Cluster.build(shapes, machines_per_rack=c.machines_per_rack)


def _policies(source: str, d: TrainingFile) -> tuple[PolicySpec, ...]:
    queues, rules = _queues(source, d)
    themis_defaults = given(d.themis)
    try:  # validate the shared knobs on their own, so an error names `themis`, not a policy entry
        PolicySpec("themis", "themis", themis_defaults).build()
    except (ValueError, TypeError) as e:
        raise ScenarioError(source, "themis", str(e)) from None
    out: list[PolicySpec] = []
    for i, p in enumerate(d.policies):
        where = f"policies[{i}]"
        entry = {k: getattr(p, k) for k in p.model_fields_set}
        name = entry.pop("policy")
        if name in QUEUE_BASELINES and not queues:
            raise ScenarioError(source, f"{where}.policy", f"{name} needs a `queues:` block")
        if name not in ALL_POLICIES + QUEUE_BASELINES:
            raise ScenarioError(
                source, f"{where}.policy", f"unknown policy {name!r}; known: {', '.join(ALL_POLICIES)}"
            )
        label = str(entry.pop("label", None) or name)
        knobs: dict[str, Any]
        if name in QUEUE_BASELINES:
            known = _KUEUE_KEYS if name == "kueue-style" else set()
            for k in sorted(entry):
                if k not in known:
                    raise ScenarioError(
                        source,
                        f"{where}.{k}",
                        f"not a {name} field; known: {', '.join(sorted(known)) or 'none'}",
                    )
            knobs = {k: v for k, v in entry.items() if v is not None}
        elif name == "themis":
            knobs = {**themis_defaults, **{k: v for k, v in entry.items() if v is not None}}
        else:
            for k in sorted(entry):
                if k not in _BASELINE_KEYS:
                    raise ScenarioError(
                        source, f"{where}.{k}", f"unknown field; known: {', '.join(sorted(_BASELINE_KEYS))}"
                    )
            default_lease = math.inf if name == "drf" else d.lease_s  # drf: never preempts unless given one
            own = entry.get("lease_s")
            knobs = {"lease_s": float(own if own is not None else default_lease)}
            if entry.get("placement") is not None:  # tight | any | random; default: the paper's rule
                knobs["placement"] = entry["placement"]
        try:
            spec = PolicySpec(name, label, knobs, queues, rules)
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


def _sim(source: str, block: Any) -> SimConfig:
    s = given(block)
    if "reported_sensitivity" in s:  # {app id: {cross_machine: 2.0, ...}}: what a misreporting app claims
        try:
            s["reported_sensitivity"] = tuple(
                (k, Sensitivity(**v.model_dump(exclude_none=True)))
                for k, v in s["reported_sensitivity"].items()
            )
        except (ValueError, TypeError) as e:
            raise ScenarioError(source, "sim.reported_sensitivity", str(e)) from None
    try:
        return SimConfig(**s)
    except (ValueError, TypeError) as e:
        raise ScenarioError(source, "sim", str(e)) from None


def load(data: dict[str, Any], source: str) -> TrainingScenario:
    """Validate a training scenario mapping (already parsed from YAML at `source`)."""
    d = validate_input(TrainingFile, data, source)
    cluster = _cluster(source, d.cluster)
    t = d.trace
    trace: Trace | None = None
    gen: GeneratorConfig | None = None
    extra = Trace()
    if t.apps is not None:
        try:
            extra = build_trace(source, t.apps, len(cluster))
        except TraceError as e:
            raise ScenarioError(source, f"trace.{e.field}", e.problem) from None
    if t.file is not None:
        path = Path(t.file)
        if not path.is_absolute():
            path = Path(source).parent / path
        try:
            trace = read_trace(path, len(cluster))
        except TraceError as e:
            raise ScenarioError(source, "trace.file", str(e)) from None
    elif t.generate is not None or t.apps is None:
        try:
            gen = GeneratorConfig(**given(t.generate)) if t.generate is not None else GeneratorConfig()
        except (ValueError, TypeError) as e:
            raise ScenarioError(source, "trace.generate", str(e)) from None
    return TrainingScenario(
        name=d.name if d.name is not None else Path(source).stem,
        source=source,
        seed=d.seed,
        cluster=cluster,
        trace=trace,
        generator=gen,
        extra_apps=extra,
        policies=_policies(source, d),
        sim=_sim(source, d.sim),
        queues=_queues(source, d)[0],
    )


def _run_one(scenario: TrainingScenario, spec: PolicySpec, trace: Trace) -> SimRun:
    if not scenario.queues:
        return simulate(spec.build(), scenario.cluster, trace, random.Random(scenario.seed), scenario.sim)
    meter = QueueMeter(with_default(scenario.queues))
    run = simulate(
        spec.build(), scenario.cluster, trace, random.Random(scenario.seed), scenario.sim, observers=[meter]
    )
    app_queue = {a.id: a.queue for a in trace.apps}
    run.queues = figures(run, meter, scenario.queues, len(scenario.cluster), app_queue).to_json()
    return run


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
