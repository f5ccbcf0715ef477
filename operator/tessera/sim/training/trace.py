"""Training traces: the app/job records, a CSV and YAML reader, and a seeded generator.

YAML (a list under `apps:`; see docs/simulate.md and examples/scenarios/):

    apps:
      - id: a1
        arrival: 0                 # seconds
        model: vgg16               # optional; sets category and network intensity
        network_intensive: true    # optional override; or sensitivity: {cross_machine: 1.29, cross_rack: 1.52}
        jobs:                      # gang-scheduled jobs, run to their stop iteration
          - {iterations: 2000, iter_time: 0.8, gpus: 4}
      - id: a2
        arrival: 60
        halving: {iters_per_phase: [8, 16, 36], job_gpus: 8, eta: 2}   # demand_growth: 2 doubles
                                   # survivors' GPUs per phase (paper text); default 1 (worked example)
        configs: [{iter_time: 80, score: 3}, {iter_time: 100, score: 2}, ...]   # 2^k configs

CSV: one row per job (or per successive-halving config), grouped by `app`:

    app,arrival,model,network_intensive,iterations,iter_time,gpus,score,iters_per_phase,eta

`iters_per_phase` ("8;16;36") marks a successive-halving app; its `gpus` is job_demand_max.

The generator follows Themis §2.2 and §6.1: Poisson arrivals, 10 % single-job apps, the rest
hyperparameter explorations; W1: 1–2 GPUs per job; W2: successive halving with 1/2/4/8 GPUs per job;
the CV 10 % / NLP 60 % / Speech 30 % model mix of Table 4.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, field_validator

from tessera.cluster import COMPUTE_INTENSIVE, NETWORK_INTENSIVE, Sensitivity
from tessera.sim.inputs import INT64, Bool, Gpus, Input, Int, NonNegative, Positive, PositiveInt
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import MAX_APPS, MAX_NUMBER, ScenarioError
from tessera.sim.tuning.app_spec import TuningAppSpec, TuningBlock, TuningSpecError


class TraceError(ValueError):
    """A bad trace. The message names the file, the record and the field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: {field}: {problem}")


# model → (category, network-intensive, serial seconds per iteration on one K80-class GPU).
# Network intensity follows Table 1 (VGG16 1.29× slower across servers, Inception-v3 unaffected) and the
# usual parameter-size argument; iteration times are Tessera's representative values.
MODELS: dict[str, tuple[str, bool, float]] = {
    "inception-v3": ("cv", False, 1.2),
    "alexnet": ("cv", True, 0.4),
    "resnet50": ("cv", False, 0.9),
    "vgg16": ("cv", True, 1.0),
    "vgg19": ("cv", True, 1.2),
    "bidaf": ("nlp", False, 0.6),
    "langmodel": ("nlp", True, 0.3),
    "gnmt": ("nlp", True, 0.7),
    "transformer": ("nlp", True, 0.5),
    "wavenet": ("speech", False, 1.5),
    "deepspeech": ("speech", True, 1.1),
}
CATEGORY_MIX = {"cv": 0.10, "nlp": 0.60, "speech": 0.30}  # Table 4


@dataclass(frozen=True, slots=True)
class TraceJob:
    iterations: float
    iter_time: float
    gpus: int
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class HalvingSpec:
    iters_per_phase: tuple[float, ...]
    job_gpus: int  # a phase-1 job's GPU demand
    eta: int = 2
    demand_growth: int = 1  # survivors' demand × this per phase (HalvingPlan.demand_growth)


@dataclass(frozen=True, slots=True)
class TraceApp:
    id: str
    arrival: float
    jobs: tuple[TraceJob, ...]
    sensitivity: Sensitivity = NETWORK_INTENSIVE
    network_intensive: bool = True
    model: str = ""
    halving: HalvingSpec | None = None
    tuning: TuningAppSpec | None = None  # a tuning App: Fluid runs its trials inside its lease (no jobs)
    queue: str = "default"  # the team queue it belongs to (a scenario's `queues:` block)
    priority: int = 0  # inside its queue, higher priorities are served first
    preemptible: bool = True  # False: once running it keeps its GPUs until it is done

    @property
    def work(self) -> float:
        if self.tuning is not None:
            return 0.0  # an adaptive tuner's work is known only as it runs
        if self.halving is None:
            return sum(j.iterations * j.iter_time for j in self.jobs)
        times = sorted(j.iter_time for j in self.jobs)
        med = times[len(times) // 2]
        n = len(self.jobs)
        return float(
            sum(
                max(1, n // self.halving.eta**p) * it * med
                for p, it in enumerate(self.halving.iters_per_phase)
            )
        )


@dataclass(slots=True)
class Trace:
    apps: list[TraceApp] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = []
        for a in self.apps:
            d: dict[str, Any] = {"id": a.id, "arrival": a.arrival, "network_intensive": a.network_intensive}
            if a.model:
                d["model"] = a.model
            d["sensitivity"] = {
                "cross_machine": a.sensitivity.cross_machine,
                "cross_rack": a.sensitivity.cross_rack,
            }
            if a.tuning is not None:
                d["tuning"] = a.tuning.to_dict()
            elif a.halving is None:
                d["jobs"] = [
                    {"iterations": j.iterations, "iter_time": j.iter_time, "gpus": j.gpus} for j in a.jobs
                ]
            else:
                d["halving"] = {
                    "iters_per_phase": list(a.halving.iters_per_phase),
                    "job_gpus": a.halving.job_gpus,
                    "eta": a.halving.eta,
                    "demand_growth": a.halving.demand_growth,
                }
                d["configs"] = [{"iter_time": j.iter_time, "score": j.score} for j in a.jobs]
            out.append(d)
        return {"apps": out}


# --- reading ---------------------------------------------------------------------------------------


Eta = Annotated[int, Strict(), Field(ge=2, le=INT64)]  # successive halving keeps 1/eta per phase


class JobInput(Input):
    """One gang-scheduled job: run `iterations` iterations of `iter_time` seconds each on `gpus` GPUs."""

    iterations: Positive
    iter_time: Positive | None = None
    """Seconds per iteration on one GPU; default: the model's."""
    gpus: Gpus


class ConfigInput(Input):
    """One successive-halving configuration."""

    iter_time: Positive | None = None
    """Seconds per iteration on one GPU; default: the model's."""
    score: NonNegative | None = None
    """Quality score; default: by list order, best first."""


class HalvingInput(Input):
    iters_per_phase: Annotated[list[Positive], Field(min_length=1)]
    job_gpus: Gpus = 1
    eta: Eta = 2
    demand_growth: PositiveInt = 1


class SensitivityInput(Input):
    """Slowdown per locality level, over the app's default (network- or compute-intensive)."""

    slot: Positive | None = None
    machine: Positive | None = None
    cross_machine: Positive | None = None
    cross_rack: Positive | None = None


class AppInput(Input):
    """One app of a training trace: `jobs`, or `halving` with `configs`, or a `tuning` block."""

    id: str | Int | None = None
    """Default: app-NNNN by position in the list."""
    arrival: NonNegative
    """Seconds since the trace start."""
    model: str = ""
    network_intensive: Bool | None = None
    sensitivity: SensitivityInput | None = None
    jobs: Annotated[list[JobInput], Field(min_length=1)] | None = None
    halving: HalvingInput | None = None
    configs: Annotated[list[ConfigInput], Field(min_length=1)] | None = None
    tuning: TuningBlock | None = None
    queue: str = "default"
    """The team queue of a scenario's `queues:` block the app belongs to."""
    priority: Int = 0
    """Inside its queue, higher priorities are served first (an App's PriorityClass value)."""
    preemptible: Bool = True
    """false: once running it keeps its GPUs until it is done; nothing reclaims or preempts them."""

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        v = v.lower()
        if v and v not in MODELS:
            raise ValueError(f"unknown model {v!r}; known: {', '.join(sorted(MODELS))}")
        return v


class TraceFile(Input):
    """A trace YAML: `apps:`, a list of apps."""

    apps: Annotated[list[AppInput], Field(max_length=MAX_APPS)]


def _sensitivity(app: AppInput) -> tuple[Sensitivity, bool]:
    ni = MODELS[app.model][1] if app.model else True
    if app.network_intensive is not None:
        ni = app.network_intensive
    sens = NETWORK_INTENSIVE if ni else COMPUTE_INTENSIVE
    if app.sensitivity is not None:
        given = app.sensitivity.model_dump(exclude_none=True)
        sens = Sensitivity(**{**dataclasses.asdict(sens), **given})
    return sens, ni


def _app(app: AppInput, i: int, where: str, cluster_gpus: int | None) -> TraceApp:
    """The TraceApp of a validated app; ValueError (field under `where`, problem) for cross-field rules."""
    default_it = MODELS[app.model][2] if app.model else None
    jobs: list[TraceJob] = []
    halving = tuning = None
    if app.tuning is not None:
        for other in ("jobs", "halving", "configs"):
            if getattr(app, other) is not None:
                raise _Bad(f"{where}.{other}", "a tuning app has no jobs, halving or configs")
        try:
            tuning = TuningAppSpec.of(app.tuning, cluster_gpus)
        except TuningSpecError as e:
            raise _Bad(f"{where}.tuning.{e.field}", e.problem) from None
        gpus_needed = 1
    elif app.halving is not None:
        h = app.halving
        halving = HalvingSpec(tuple(h.iters_per_phase), h.job_gpus, h.eta, h.demand_growth)
        if app.configs is None:
            raise _Bad(f"{where}.configs", "a successive-halving app needs a list of configs")
        need = h.eta ** (len(h.iters_per_phase) - 1)
        if len(app.configs) < need:
            raise _Bad(
                f"{where}.configs",
                f"{len(h.iters_per_phase)} phases with eta={h.eta} need at least {need} configs, "
                f"got {len(app.configs)}",
            )
        for k, c in enumerate(app.configs):
            it = c.iter_time if c.iter_time is not None else default_it
            if it is None:
                raise _Bad(
                    f"{where}.configs[{k}].iter_time", "is required (seconds per iteration on one GPU)"
                )
            score = c.score if c.score is not None else float(len(app.configs) - k)
            jobs.append(TraceJob(h.iters_per_phase[0], it, h.job_gpus, score))
        gpus_needed = h.job_gpus
    elif app.jobs is not None:
        for k, j in enumerate(app.jobs):
            it = j.iter_time if j.iter_time is not None else default_it
            if it is None:
                raise _Bad(f"{where}.jobs[{k}].iter_time", "is required (seconds per iteration on one GPU)")
            jobs.append(TraceJob(j.iterations, it, j.gpus))
        gpus_needed = max(j.gpus for j in jobs)
    else:
        raise _Bad(f"{where}.jobs", "is required: a non-empty list of jobs (or a halving or tuning block)")
    if cluster_gpus is not None and gpus_needed > cluster_gpus:
        raise _Bad(where, f"a job asks for {gpus_needed} GPUs but the cluster has {cluster_gpus}")
    try:
        sens, ni = _sensitivity(app)
    except ValueError as e:
        raise _Bad(f"{where}.sensitivity", str(e)) from None
    app_id = str(app.id) if app.id is not None else f"app-{i:04d}"
    return TraceApp(
        app_id,
        app.arrival,
        tuple(jobs),
        sens,
        ni,
        app.model,
        halving,
        tuning,
        app.queue,
        app.priority,
        app.preemptible,
    )


class _Bad(Exception):
    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem


def parse_apps(source: str, records: Any, cluster_gpus: int | None = None) -> Trace:
    """Validate a list of app mappings (the YAML form) into a Trace; TraceError names the field."""
    try:
        trace = validate_input(TraceFile, {"apps": records}, source)
    except ScenarioError as e:
        raise TraceError(source, e.field, e.problem) from None
    return build_trace(source, trace.apps, cluster_gpus)


def build_trace(source: str, inputs: list[AppInput], cluster_gpus: int | None = None) -> Trace:
    """The Trace of validated apps; TraceError for the rules across fields (and the cluster's size)."""
    apps: list[TraceApp] = []
    seen: set[str] = set()
    for i, app in enumerate(inputs):
        try:
            spec = _app(app, i, f"apps[{i}]", cluster_gpus)
        except _Bad as e:
            raise TraceError(source, e.field, e.problem) from None
        if spec.id in seen:
            raise TraceError(source, f"apps[{i}].id", f"duplicate app id {spec.id!r}")
        seen.add(spec.id)
        apps.append(spec)
    apps.sort(key=lambda a: (a.arrival, a.id))
    return Trace(apps)


def read_trace(path: str | Path, cluster_gpus: int | None = None) -> Trace:
    """Read a trace file (.csv, .yaml or .yml)."""
    p = Path(path)
    source = str(p)
    if not p.exists():
        raise TraceError(source, "trace", "file not found")
    if p.suffix.lower() == ".csv":
        return parse_apps(source, _csv_records(source, p), cluster_gpus)
    if p.suffix.lower() in (".yaml", ".yml"):
        from tessera.api.safe_load import InputError, load_yaml_file

        try:
            data = load_yaml_file(p)
        except InputError as e:  # too big, not UTF-8, too deep, not YAML, NaN/inf at a field
            raise TraceError(source, e.field or "trace", e.problem) from None
        if not isinstance(data, Mapping) or "apps" not in data:
            raise TraceError(source, "apps", "is required: a trace YAML has a top-level `apps:` list")
        unknown = sorted(str(k) for k in data if k != "apps")
        if unknown:
            raise TraceError(source, unknown[0], "unknown field; known: apps")
        return parse_apps(source, data["apps"], cluster_gpus)
    raise TraceError(source, "trace", f"unknown trace format {p.suffix!r}; use .csv, .yaml or .yml")


_CSV_COLUMNS = (
    "app",
    "arrival",
    "model",
    "network_intensive",
    "iterations",
    "iter_time",
    "gpus",
    "score",
    "iters_per_phase",
    "eta",
)


def _cell(value: Any) -> Any:
    """A CSV cell as the number it spells (int when whole), else unchanged, so the model names the field."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and abs(number) < 2**63 else number


def _flag(value: str) -> Any:
    """A CSV boolean: true/1/yes or false/0/no (any case), else unchanged."""
    word = value.strip().lower()
    return True if word in ("true", "1", "yes") else False if word in ("false", "0", "no") else value


def _csv_records(source: str, p: Path) -> list[dict[str, Any]]:
    from tessera.api.safe_load import InputError, read_text

    try:
        text = read_text(p)  # size and encoding checked: one line naming the file, not a traceback
    except InputError as e:
        raise TraceError(source, "trace", e.problem) from None
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or "app" not in reader.fieldnames or "arrival" not in reader.fieldnames:
            raise TraceError(
                source,
                "header",
                f"needs at least `app` and `arrival` columns; known: {', '.join(_CSV_COLUMNS)}",
            )
        unknown = [c for c in reader.fieldnames if c not in _CSV_COLUMNS]
        if unknown:
            raise TraceError(source, "header", f"unknown columns {unknown}; known: {', '.join(_CSV_COLUMNS)}")
        apps: dict[str, dict[str, Any]] = {}
        for n, row in enumerate(reader, start=2):
            app = apps.get(row["app"])
            if app is None:
                app = apps[row["app"]] = _csv_app(source, f"line {n}", row)
            if "halving" in app:
                cfg: dict[str, Any] = {}
                if row.get("iter_time"):
                    cfg["iter_time"] = _cell(row["iter_time"])
                if row.get("score"):
                    cfg["score"] = _cell(row["score"])
                app["configs"].append(cfg)
            else:
                job: dict[str, Any] = {
                    "iterations": _cell(row.get("iterations") or None),
                    "gpus": _cell(row.get("gpus") or None),
                }
                if row.get("iter_time"):
                    job["iter_time"] = _cell(row["iter_time"])
                app["jobs"].append({k: v for k, v in job.items() if v is not None})
        return list(apps.values())


def _csv_app(source: str, where: str, row: dict[str, str]) -> dict[str, Any]:
    """An app's record from its first CSV row (its jobs or halving configs are added row by row)."""
    app: dict[str, Any] = {"id": row["app"], "arrival": _cell(row["arrival"])}
    if row.get("model"):
        app["model"] = row["model"]
    if row.get("network_intensive"):
        app["network_intensive"] = _flag(row["network_intensive"])
    if not row.get("iters_per_phase"):
        app["jobs"] = []
        return app
    try:
        ipp = [float(x) for x in row["iters_per_phase"].split(";")]
    except ValueError:
        raise TraceError(source, f"{where}.iters_per_phase", "expected numbers separated by ';'") from None
    app["halving"] = {
        "iters_per_phase": ipp,
        "job_gpus": _cell(row.get("gpus") or 1),
        "eta": _cell(row.get("eta") or 2),
    }
    app["configs"] = []
    return app


# --- generating ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    """Knobs of the synthetic workload. Defaults are the paper's statistics (Themis §2.2, §6.1): lognormal task
    size with median 3.75 GPU-hours and a wide spread (Fig. 4: "a significant fraction" 10× shorter, many
    10× longer), 10 % single-job apps, the rest exploring 10–100 configurations with a median of 75
    (Fig. 2; W2 rounds to a power of two), so the median app is ≈ 75 × 3.75 GPU-h ≈ 11.7 GPU-days (Fig. 3).
    A run is kept small by the number of apps and the cluster, never by shortening tasks."""

    apps: int = 200
    workload: Literal["w1", "w2"] = "w2"
    mean_interarrival_s: float = 600.0  # Poisson arrivals
    single_job_share: float = 0.10  # ≈10 % single-job apps (Fig. 2)
    jobs_per_app: tuple[int, int] = (10, 100)  # exploration apps: range (Fig. 2); W2 rounds to a power of two
    jobs_per_app_median: float = 75.0  # Fig. 2: median 75 jobs per exploration app
    task_gpu_hours_median: float = 3.75  # Fig. 4: median task 3.75 GPU-hours
    task_gpu_hours_sigma: float = 1.5  # lognormal σ: ≈ 6 % of tasks are 10× shorter, 6 % 10× longer
    min_trial_s: float = 300.0  # shortest phase-1 trial / job on its own GPUs (keeps restarts a small cost)
    halving_demand_growth: int = 2  # W2 survivors' GPUs × 2 per phase as jobs halve (Themis §4.3.2)
    network_intensive_share: float | None = None  # None: from the model mix; else the share (Fig. 15)

    def __post_init__(self) -> None:
        if self.apps < 1:
            raise ValueError(f"apps must be >= 1, got {self.apps}")
        if self.apps > MAX_APPS:
            raise ValueError(f"apps: {self.apps} is more than {MAX_APPS}, the most a scenario accepts")
        for name in ("mean_interarrival_s", "single_job_share", "jobs_per_app_median", "task_gpu_hours_median",
                     "task_gpu_hours_sigma", "min_trial_s"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or abs(value) > MAX_NUMBER:
                raise ValueError(f"{name} must be a finite number of at most {MAX_NUMBER:g}, got {value!r}")
        if self.workload not in ("w1", "w2"):
            raise ValueError(f"workload must be 'w1' or 'w2', got {self.workload!r}")
        lo, hi = self.jobs_per_app
        if not 1 <= lo <= hi:
            raise ValueError(f"jobs_per_app must be [lo, hi] with 1 <= lo <= hi, got {self.jobs_per_app}")
        if not lo <= self.jobs_per_app_median <= hi:
            raise ValueError(
                f"jobs_per_app_median must lie in jobs_per_app {self.jobs_per_app}, got {self.jobs_per_app_median}"
            )
        if self.network_intensive_share is not None and not 0 <= self.network_intensive_share <= 1:
            raise ValueError(f"network_intensive_share must be in [0, 1], got {self.network_intensive_share}")
        if self.mean_interarrival_s <= 0 or self.task_gpu_hours_median <= 0 or self.min_trial_s < 0:
            raise ValueError(
                "mean_interarrival_s and task_gpu_hours_median must be positive, min_trial_s >= 0"
            )
        if self.halving_demand_growth < 1:
            raise ValueError(f"halving_demand_growth must be >= 1, got {self.halving_demand_growth}")
        if self.task_gpu_hours_sigma < 0:
            raise ValueError(f"task_gpu_hours_sigma must be >= 0, got {self.task_gpu_hours_sigma}")


def _pick_model(rng: random.Random) -> str:
    cat = rng.choices(list(CATEGORY_MIX), weights=list(CATEGORY_MIX.values()))[0]
    return rng.choice([m for m, (c, _, _) in MODELS.items() if c == cat])


def _jobs_per_app(config: GeneratorConfig, rng: random.Random) -> int:
    """Half the apps below the median, half above, uniform on each side (Fig. 2 gives range and median)."""
    lo, hi = config.jobs_per_app
    med = config.jobs_per_app_median
    x = rng.uniform(lo, med) if rng.random() < 0.5 else rng.uniform(med, hi)
    return max(lo, min(hi, round(x)))


def generate(config: GeneratorConfig, rng: random.Random, cluster_gpus: int = 64) -> Trace:
    """A seeded synthetic trace."""
    apps: list[TraceApp] = []
    t = 0.0
    max_gpus = max(1, min(8, cluster_gpus))
    for i in range(config.apps):
        if i:
            t += rng.expovariate(1.0 / config.mean_interarrival_s)
        model = _pick_model(rng)
        _, ni, base_it = MODELS[model]
        coin = rng.random()  # always drawn, so traces that differ only in the share share everything else
        if config.network_intensive_share is not None:
            ni = coin < config.network_intensive_share
        sens = NETWORK_INTENSIVE if ni else COMPUTE_INTENSIVE
        # One task's serial GPU-seconds (Fig. 4: a task is one job of the app); an app's size follows from
        # its number of tasks (Fig. 3 = Fig. 2 × Fig. 4).
        task = 3600.0 * rng.lognormvariate(
            math.log(config.task_gpu_hours_median), config.task_gpu_hours_sigma
        )
        it = base_it * rng.uniform(0.8, 1.25)
        app_id = f"app-{i:04d}"
        single = rng.random() < config.single_job_share
        if config.workload == "w1":
            n = 1 if single else _jobs_per_app(config, rng)
            jobs = []
            for _ in range(n):
                g = rng.choice((1, 2))
                jt = it * rng.uniform(0.9, 1.1)
                work = max(task * rng.uniform(0.5, 1.5), config.min_trial_s * g)
                jobs.append(TraceJob(max(1.0, round(work / jt)), jt, g))
            apps.append(TraceApp(app_id, round(t, 3), tuple(jobs), sens, ni, model))
            continue
        g = min(max_gpus, rng.choice((1, 2, 4, 8)))
        if single:
            work = max(task, config.min_trial_s * g)
            apps.append(
                TraceApp(app_id, round(t, 3), (TraceJob(max(1.0, round(work / it)), it, g),), sens, ni, model)
            )
            continue
        n = max(2, 2 ** round(math.log2(_jobs_per_app(config, rng))))
        phases = int(math.log2(n)) + 1
        # Equal budget per phase (Hyperband): phase p runs n/2^p configs for I_p = I_1·2^p iterations, so
        # the app's n·task GPU-seconds split evenly over its phases: I_1 = task / (phases · iter_time).
        i1 = max(1.0, round(task / (phases * it)), math.ceil(config.min_trial_s * g / it))
        ipp = tuple(float(i1 * 2**p) for p in range(phases))
        configs = tuple(TraceJob(i1, it * rng.uniform(0.8, 1.25), g, rng.random()) for _ in range(n))
        apps.append(
            TraceApp(
                app_id,
                round(t, 3),
                configs,
                sens,
                ni,
                model,
                HalvingSpec(ipp, g, 2, config.halving_demand_growth),
            )
        )
    return Trace(apps)
