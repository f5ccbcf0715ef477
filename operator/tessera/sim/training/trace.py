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

The generator follows spec seed-themis §4.2–4.4: Poisson arrivals, 10 % single-job apps, the rest
hyperparameter explorations; W1: 1–2 GPUs per job; W2: successive halving with 1/2/4/8 GPUs per job;
the CV 10 % / NLP 60 % / Speech 30 % model mix of Table 4.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tessera.cluster import COMPUTE_INTENSIVE, NETWORK_INTENSIVE, Sensitivity
from tessera.sim.scenario import MAX_APPS, MAX_NUMBER
from tessera.sim.tuning.app_spec import TuningAppSpec, TuningSpecError


class TraceError(ValueError):
    """A bad trace. The message names the file, the record and the field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: {field}: {problem}")


# model → (category, network-intensive, serial seconds per iteration on one K80-class GPU).
# Network intensity follows Table 1 (VGG16 1.29× slower across servers, Inception-v3 unaffected) and the
# usual parameter-size argument; iteration times are [OURS] representative values.
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
class JobSpec:
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
class AppSpec:
    id: str
    arrival: float
    jobs: tuple[JobSpec, ...]
    sensitivity: Sensitivity = NETWORK_INTENSIVE
    network_intensive: bool = True
    model: str = ""
    halving: HalvingSpec | None = None
    tuning: TuningAppSpec | None = None  # a tuning App: Fluid runs its trials inside its lease (no jobs)

    @property
    def work(self) -> float:
        if self.tuning is not None:
            return 0.0  # an adaptive tuner's work is known only as it runs
        if self.halving is None:
            return sum(j.iterations * j.iter_time for j in self.jobs)
        times = sorted(j.iter_time for j in self.jobs)
        med = times[len(times) // 2]
        n = len(self.jobs)
        return sum(
            max(1, n // self.halving.eta**p) * it * med for p, it in enumerate(self.halving.iters_per_phase)
        )


@dataclass(slots=True)
class Trace:
    apps: list[AppSpec] = field(default_factory=list)

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


def _num(source: str, where: str, value: Any, *, positive: bool = True, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TraceError(source, where, f"expected a number, got {value!r}") from None
    if not math.isfinite(value) or (positive and value <= 0) or (not positive and value < 0):
        raise TraceError(
            source, where, f"expected a {'positive' if positive else 'non-negative'} number, got {value}"
        )
    if value > MAX_NUMBER:
        raise TraceError(source, where, f"{value:g} is more than {MAX_NUMBER:g}, the most a trace accepts")
    if integer and float(value) != int(value):
        raise TraceError(source, where, f"expected a whole number, got {value}")
    return float(value)


def _bool(source: str, where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "1", "yes"):
        return True
    if str(value).strip().lower() in ("false", "0", "no", ""):
        return False
    raise TraceError(source, where, f"expected true or false, got {value!r}")


def _sensitivity(source: str, where: str, app: Mapping[str, Any]) -> tuple[Sensitivity, bool, str]:
    model = str(app.get("model", "") or "").lower()
    if model and model not in MODELS:
        raise TraceError(
            source, f"{where}.model", f"unknown model {model!r}; known: {', '.join(sorted(MODELS))}"
        )
    ni = MODELS[model][1] if model else True
    if app.get("network_intensive") not in (None, ""):
        ni = _bool(source, f"{where}.network_intensive", app["network_intensive"])
    sens = NETWORK_INTENSIVE if ni else COMPUTE_INTENSIVE
    if "sensitivity" in app and app["sensitivity"] is not None:
        s = app["sensitivity"]
        if not isinstance(s, Mapping):
            raise TraceError(
                source, f"{where}.sensitivity", "expected a mapping of locality level → slowdown"
            )
        known = {"slot", "machine", "cross_machine", "cross_rack"}
        for k in s:
            if k not in known:
                raise TraceError(source, f"{where}.sensitivity.{k}", f"unknown level; use {sorted(known)}")
        vals = {k: _num(source, f"{where}.sensitivity.{k}", v) for k, v in s.items()}
        try:
            sens = Sensitivity(
                slot=vals.get("slot", sens.slot),
                machine=vals.get("machine", sens.machine),
                cross_machine=vals.get("cross_machine", sens.cross_machine),
                cross_rack=vals.get("cross_rack", sens.cross_rack),
            )
        except ValueError as e:
            raise TraceError(source, f"{where}.sensitivity", str(e)) from None
    return sens, ni, model


def parse_apps(source: str, records: Sequence[Any], cluster_gpus: int | None = None) -> Trace:
    """Validate a list of app mappings (the YAML form) into a Trace."""
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
        raise TraceError(source, "apps", "expected a list of apps")
    apps: list[AppSpec] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        where = f"apps[{i}]"
        if not isinstance(rec, Mapping):
            raise TraceError(source, where, "expected a mapping with id, arrival and jobs, halving or tuning")
        app_id = str(rec.get("id", f"app-{i:04d}"))
        if app_id in seen:
            raise TraceError(source, f"{where}.id", f"duplicate app id {app_id!r}")
        seen.add(app_id)
        if "arrival" not in rec:
            raise TraceError(source, f"{where}.arrival", "missing (seconds since the trace start)")
        arrival = _num(source, f"{where}.arrival", rec["arrival"], positive=False)
        sens, ni, model = _sensitivity(source, where, rec)
        default_it = MODELS[model][2] if model else None
        halving = None
        tuning = None
        if "tuning" in rec:
            for other in ("jobs", "halving", "configs"):
                if other in rec:
                    raise TraceError(
                        source, f"{where}.{other}", "a tuning app has no jobs, halving or configs"
                    )
            try:
                tuning = TuningAppSpec.parse(rec["tuning"], cluster_gpus)
            except TuningSpecError as e:
                raise TraceError(
                    source, f"{where}.tuning" + (f".{e.field}" if e.field else ""), e.problem
                ) from None
            jobs: list[JobSpec] = []
            gpus_needed = 1
        elif "halving" in rec:
            h = rec["halving"]
            if not isinstance(h, Mapping):
                raise TraceError(source, f"{where}.halving", "expected iters_per_phase, job_gpus, eta")
            ipp = h.get("iters_per_phase")
            if not isinstance(ipp, Sequence) or isinstance(ipp, str) or not ipp:
                raise TraceError(source, f"{where}.halving.iters_per_phase", "expected a non-empty list")
            eta = int(_num(source, f"{where}.halving.eta", h.get("eta", 2), integer=True))
            if eta < 2:
                raise TraceError(source, f"{where}.halving.eta", f"must be >= 2, got {eta}")
            halving = HalvingSpec(
                tuple(_num(source, f"{where}.halving.iters_per_phase[{k}]", v) for k, v in enumerate(ipp)),
                int(_num(source, f"{where}.halving.job_gpus", h.get("job_gpus", 1), integer=True)),
                eta,
                int(_num(source, f"{where}.halving.demand_growth", h.get("demand_growth", 1), integer=True)),
            )
            cfgs = rec.get("configs")
            if not isinstance(cfgs, Sequence) or not cfgs:
                raise TraceError(
                    source, f"{where}.configs", "a successive-halving app needs a list of configs"
                )
            need = eta ** (len(halving.iters_per_phase) - 1)
            if len(cfgs) < need:
                raise TraceError(
                    source,
                    f"{where}.configs",
                    f"{len(halving.iters_per_phase)} phases with eta={eta} need at least {need} configs, got {len(cfgs)}",
                )
            jobs = []
            for k, c in enumerate(cfgs):
                w = f"{where}.configs[{k}]"
                if not isinstance(c, Mapping):
                    raise TraceError(source, w, "expected a mapping with iter_time (and score)")
                it = c.get("iter_time", default_it)
                if it is None:
                    raise TraceError(source, f"{w}.iter_time", "missing (seconds per iteration on one GPU)")
                score = _num(source, f"{w}.score", c.get("score", len(cfgs) - k), positive=False)
                jobs.append(
                    JobSpec(
                        halving.iters_per_phase[0],
                        _num(source, f"{w}.iter_time", it),
                        halving.job_gpus,
                        score,
                    )
                )
            gpus_needed = halving.job_gpus
        else:
            js = rec.get("jobs")
            if not isinstance(js, Sequence) or isinstance(js, str) or not js:
                raise TraceError(
                    source,
                    f"{where}.jobs",
                    "expected a non-empty list of jobs (or a halving or tuning block)",
                )
            jobs = []
            for k, j in enumerate(js):
                w = f"{where}.jobs[{k}]"
                if not isinstance(j, Mapping):
                    raise TraceError(source, w, "expected a mapping with iterations, iter_time, gpus")
                for key in ("iterations", "gpus"):
                    if key not in j:
                        raise TraceError(source, f"{w}.{key}", "missing")
                it = j.get("iter_time", default_it)
                if it is None:
                    raise TraceError(source, f"{w}.iter_time", "missing (seconds per iteration on one GPU)")
                jobs.append(
                    JobSpec(
                        _num(source, f"{w}.iterations", j["iterations"]),
                        _num(source, f"{w}.iter_time", it),
                        int(_num(source, f"{w}.gpus", j["gpus"], integer=True)),
                    )
                )
            gpus_needed = max(j.gpus for j in jobs)
        if cluster_gpus is not None and gpus_needed > cluster_gpus:
            raise TraceError(
                source, where, f"a job asks for {gpus_needed} GPUs but the cluster has {cluster_gpus}"
            )
        apps.append(AppSpec(app_id, arrival, tuple(jobs), sens, ni, model, halving, tuning))
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
            raise TraceError(source, "apps", "missing: a trace YAML has a top-level `apps:` list")
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
            where = f"line {n}"
            app = apps.get(row["app"])
            if app is None:
                app = {"id": row["app"], "arrival": row["arrival"]}
                if row.get("model"):
                    app["model"] = row["model"]
                if row.get("network_intensive"):
                    app["network_intensive"] = row["network_intensive"]
                if row.get("iters_per_phase"):
                    try:
                        ipp = [float(x) for x in row["iters_per_phase"].split(";")]
                    except ValueError:
                        raise TraceError(
                            source, f"{where}.iters_per_phase", "expected numbers separated by ';'"
                        ) from None
                    app["halving"] = {
                        "iters_per_phase": ipp,
                        "job_gpus": row.get("gpus") or 1,
                        "eta": row.get("eta") or 2,
                    }
                    app["configs"] = []
                else:
                    app["jobs"] = []
                apps[row["app"]] = app
            if "halving" in app:
                cfg: dict[str, Any] = {}
                if row.get("iter_time"):
                    cfg["iter_time"] = row["iter_time"]
                if row.get("score"):
                    cfg["score"] = row["score"]
                app["configs"].append(cfg)
            else:
                job: dict[str, Any] = {
                    "iterations": row.get("iterations") or None,
                    "gpus": row.get("gpus") or None,
                }
                if row.get("iter_time"):
                    job["iter_time"] = row["iter_time"]
                app["jobs"].append({k: v for k, v in job.items() if v is not None})
        return list(apps.values())


# --- generating ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    """Knobs of the synthetic workload. Defaults are the paper's statistics (spec §4.2–4.3): lognormal task
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
    halving_demand_growth: int = 2  # W2 survivors' GPUs × 2 per phase as jobs halve (L981–L993)
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
    apps: list[AppSpec] = []
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
                jobs.append(JobSpec(max(1.0, round(work / jt)), jt, g))
            apps.append(AppSpec(app_id, round(t, 3), tuple(jobs), sens, ni, model))
            continue
        g = min(max_gpus, rng.choice((1, 2, 4, 8)))
        if single:
            work = max(task, config.min_trial_s * g)
            apps.append(
                AppSpec(app_id, round(t, 3), (JobSpec(max(1.0, round(work / it)), it, g),), sens, ni, model)
            )
            continue
        n = max(2, 2 ** round(math.log2(_jobs_per_app(config, rng))))
        phases = int(math.log2(n)) + 1
        # Equal budget per phase (Hyperband): phase p runs n/2^p configs for I_p = I_1·2^p iterations, so
        # the app's n·task GPU-seconds split evenly over its phases: I_1 = task / (phases · iter_time).
        i1 = max(1.0, round(task / (phases * it)), math.ceil(config.min_trial_s * g / it))
        ipp = tuple(float(i1 * 2**p) for p in range(phases))
        configs = tuple(JobSpec(i1, it * rng.uniform(0.8, 1.25), g, rng.random()) for _ in range(n))
        apps.append(
            AppSpec(
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
