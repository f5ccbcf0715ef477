"""Simulator runs as timestamped Prometheus series, so the live dashboards can show a what-if run.

`write_openmetrics` writes any catalogue series (tessera.api.metrics_catalog) as OpenMetrics text with
explicit timestamps, the input `promtool tsdb create-blocks-from openmetrics` backfills into a TSDB that
Prometheus (and Grafana through it) then serves like a scraped history. `write_training_openmetrics` turns
a training simulation's ρ timeline into the Fairness dashboard's series; the tuning and serving simulators
can build their own `Sample` lists and reuse the writer.

Policies and labels: the catalogue gives `tessera_app_rho` and friends only `namespace` and `app`, so a run's
policy cannot be a label. Each policy's run goes into its own namespace, `<prefix>-<policy>` (default prefix
`sim`: `sim-themis`, `sim-drf`, ...), and every run starts at the same wall-clock instant: the dashboard's
namespace selector then switches between (or overlays) the policies of one what-if run. Select one
namespace at a time for the aggregate panels (max ρ, Jain's index), which otherwise pool the policies.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import tessera
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import Component, MetricType

log = logging.getLogger(__name__)

# Series a training run's timeline cannot honestly give, and why (docs/operations.md "What-if runs").
TRAINING_NOT_DERIVED: Final[Mapping[str, str]] = {
    "tessera_lease_changes_total": "the timeline has GPU counts per round, not which leases were granted, "
    "renewed, revoked or expired",
    "tessera_auction_duration_seconds": "the simulator does not time single arbiter rounds",
    "tessera_pending_pods": "the timeline does not record the GPUs an App still wanted",
}

_HISTOGRAM_SUFFIX_ORDER: Final = {"_bucket": 0, "_count": 1, "_sum": 2}
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one series at one instant.

    `name` is the series name PromQL sees (`tessera_auction_rounds_total`, a histogram's `..._bucket`);
    `labels` must be exactly the catalogue's labels for it (plus `le` on `_bucket`); `timestamp` is Unix
    seconds.
    """

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float
    _key: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", tuple(sorted(self.labels.items())))


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _check(sample: Sample) -> catalog.MetricSpec:
    try:
        spec = catalog.get(sample.name)
    except KeyError as err:
        raise ValueError(f"sample {sample.name!r}: {err.args[0]}") from None
    expected = set(spec.labels) | ({"le"} if sample.name.endswith("_bucket") else set())
    if set(sample.labels) != expected:
        raise ValueError(
            f"sample {sample.name!r} has labels {sorted(sample.labels)}; the catalogue wants exactly "
            f"{sorted(expected)}"
        )
    if not math.isfinite(sample.timestamp) or sample.timestamp < 0:
        raise ValueError(
            f"sample {sample.name!r} {dict(sample.labels)}: timestamp {sample.timestamp} is not a "
            "Unix time in seconds"
        )
    if spec.type is MetricType.COUNTER and not (math.isfinite(sample.value) and sample.value >= 0):
        raise ValueError(f"counter sample {sample.name!r} {dict(sample.labels)} has value {sample.value}")
    return spec


def _order(family: str, s: Sample) -> tuple[tuple[tuple[str, str], ...], float, int, float]:
    """Series by labels (a histogram's buckets, count and sum together), then time, then bucket bound."""
    base = tuple((k, v) for k, v in s._key if k != "le")
    suffix_rank = _HISTOGRAM_SUFFIX_ORDER.get(s.name[len(family) :], 0)
    le = float(s.labels["le"].replace("+Inf", "inf")) if "le" in s.labels else 0.0
    return (base, s.timestamp, suffix_rank, le)


def write_openmetrics(samples: Iterable[Sample], path: Path | str) -> int:
    """Write `samples` as OpenMetrics text with `# HELP`/`# TYPE` from the catalogue and `# EOF`.

    Families are written whole, series within a family one after the other, each in time order (what
    OpenMetrics and promtool's backfill require). A counter that goes down or two values of one series at
    the same instant are errors. Returns the number of samples written.
    """
    families: dict[str, tuple[catalog.MetricSpec, list[Sample]]] = {}
    for sample in samples:
        spec = _check(sample)
        families.setdefault(spec.name, (spec, []))[1].append(sample)

    lines: list[str] = []
    count = 0
    for spec, members in sorted(families.values(), key=lambda f: f[0].name):
        # OpenMetrics names a counter family without its `_total` sample suffix.
        family = spec.name.removesuffix("_total") if spec.type is MetricType.COUNTER else spec.name
        lines.append(f"# HELP {family} {_escape(spec.help)}")
        lines.append(f"# TYPE {family} {spec.type.value}")

        members.sort(key=lambda s: _order(spec.name, s))
        last: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
        for s in members:
            key = (s.name, s._key)
            prev = last.get(key)
            if prev is not None:
                if prev.timestamp == s.timestamp:
                    raise ValueError(f"{s.name} {dict(s.labels)} has two values at timestamp {s.timestamp}")
                if spec.type is MetricType.COUNTER and s.value < prev.value:
                    raise ValueError(
                        f"counter {s.name} {dict(s.labels)} goes down from {prev.value} to {s.value} "
                        f"at timestamp {s.timestamp}"
                    )
            last[key] = s
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s._key)
            series = f"{s.name}{{{labels}}}" if labels else s.name
            lines.append(f"{series} {_format_value(s.value)} {round(s.timestamp, 3)!r}")
            count += 1
    lines.append("# EOF")
    Path(path).write_text("\n".join(lines) + "\n")
    log.info("wrote %d samples of %d metric families to %s", count, len(families), path)
    return count


# --- training runs ----------------------------------------------------------------------------------------
class _Outcome(Protocol):
    @property
    def app_id(self) -> str: ...
    @property
    def arrival(self) -> float: ...
    @property
    def finish(self) -> float: ...
    @property
    def rho(self) -> float: ...
    @property
    def rejected(self) -> bool: ...


class TimelineRun(Protocol):
    """What the exporter reads of a tessera.sim.training.simulator.SimRun."""

    @property
    def policy(self) -> str: ...
    @property
    def apps(self) -> Sequence[_Outcome]: ...
    @property
    def rho_timeline(self) -> Sequence[tuple[float, str, float, int]]: ...


class TrainingRuns(Protocol):
    """What the exporter reads of a tessera.sim.training.report.TrainingResult."""

    @property
    def runs(self) -> Sequence[object]: ...


def policy_namespace(prefix: str, policy: str) -> str:
    """The namespace a policy's run is written under: `<prefix>-<policy>` as a Kubernetes DNS label."""
    slug = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{policy}".lower()).strip("-")[:63].rstrip("-")
    if not _DNS_LABEL.match(slug):
        raise ValueError(f"cannot make a namespace name from prefix {prefix!r} and policy {policy!r}")
    return slug


def _timeline(run: object) -> Sequence[tuple[float, str, float, int]]:
    timeline = getattr(run, "rho_timeline", None)
    if timeline is None:
        raise ValueError(
            f"run {getattr(run, 'policy', run)!r} has no rho_timeline: this simulator build does not record "
            "ρ per arbiter round, so there is nothing to export"
        )
    return timeline  # type: ignore[no-any-return]


def _rounds_counter(rounds: Sequence[float], end: float, start_unix: float, step_s: float) -> list[Sample]:
    """`tessera_auction_rounds_total` at each round and every `step_s` in between, as a scrape would see
    it: a counter's value between rounds is exactly the rounds so far, and rate() needs two points in its
    window (rounds are a lease period or at least a minute apart)."""
    if not rounds:
        return []
    points = {t: k for k, t in enumerate(rounds, start=1)}
    n_steps = int((end - rounds[0]) // step_s)
    done = 0
    for i in range(1, n_steps + 1):
        t = rounds[0] + i * step_s
        while done < len(rounds) and rounds[done] <= t:
            done += 1
        points.setdefault(t, done)
    return [Sample("tessera_auction_rounds_total", {}, float(k), start_unix + t) for t, k in points.items()]


def training_samples(
    run: TimelineRun, namespace: str, start_unix: float, *, step_s: float = 15.0
) -> list[Sample]:
    """The Fairness dashboard's series for one run, per the timeline contract (sim time s, app, ρ, GPUs).

    - `tessera_app_rho`, `tessera_app_gpus`: each timeline point (sampled at every arbiter round for every
      active App, as the operator's gauges are set); at an App's finish its realised ρ (SimRun's
      `AppOutcome.rho`, T_shared / T_independent with the paper's T_id) and 0 GPUs.
    - `tessera_app_t_shared_seconds`, `tessera_app_t_independent_seconds`: at finish only, where both are
      known: T_shared = finish − arrival and T_independent = T_shared / ρ. Between rounds the timeline
      has ρ but not its two terms.
    - `tessera_namespace_gpus{workload="training"}`: the sum over Apps at each round.
    - `tessera_auction_rounds_total`: the rounds so far, at each round and every `step_s` (label-free:
      the caller keeps one run's).

    Gauges are written at rounds only; Prometheus carries each value forward for `--query.lookback-delta`,
    which should therefore exceed the longest gap between rounds (the lease period, typically).
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s}")
    ns = namespace
    out: list[Sample] = []
    per_round: dict[float, int] = {}
    for t, app, rho, gpus in _timeline(run):
        if gpus < 0 or not math.isfinite(t):
            raise ValueError(f"run {run.policy!r}: bad timeline entry {(t, app, rho, gpus)}")
        ts = start_unix + t
        labels = {"namespace": ns, "app": app}
        # A non-finite ρ (no estimate yet) leaves the gauge unset, as the operator's arbiter does.
        if math.isfinite(rho):
            out.append(Sample("tessera_app_rho", labels, rho, ts))
        out.append(Sample("tessera_app_gpus", labels, float(gpus), ts))
        per_round[t] = per_round.get(t, 0) + gpus
    rounds = sorted(per_round)
    for t in rounds:
        ns_labels = {"namespace": ns, "workload": "training"}
        out.append(Sample("tessera_namespace_gpus", ns_labels, per_round[t], start_unix + t))
    out.extend(_rounds_counter(rounds, max([*rounds, *(a.finish for a in run.apps)]), start_unix, step_s))
    for a in run.apps:
        if a.rejected or not math.isfinite(a.rho) or a.rho <= 0:
            continue
        labels = {"namespace": ns, "app": a.app_id}
        ts = start_unix + a.finish
        t_shared = a.finish - a.arrival
        out.append(Sample("tessera_app_rho", labels, a.rho, ts))
        out.append(Sample("tessera_app_gpus", labels, 0.0, ts))
        out.append(Sample("tessera_app_t_shared_seconds", labels, t_shared, ts))
        out.append(Sample("tessera_app_t_independent_seconds", labels, t_shared / a.rho, ts))
    return out


def write_training_openmetrics(
    result: TrainingRuns,
    path: Path | str,
    *,
    start_unix: float | None = None,
    policies: Sequence[str] | None = None,
    namespace_prefix: str = "sim",
    step_s: float = 15.0,
) -> int:
    """Write a training result's runs as OpenMetrics for backfill; return the number of samples.

    Timestamps are `start_unix` + simulated seconds; by default the run is placed so its last sample is
    now (Grafana's "last N hours" then shows it). Each run goes under namespace `<prefix>-<policy>` (module
    docstring); `policies` picks runs by policy name (default: all). The label-free
    `tessera_auction_rounds_total` can hold one run only: the first selected Themis run's rounds (a warning
    names any other Themis run left out), with a point every `step_s` seconds between rounds.
    `tessera_build_info{component="simulator"}` is written at every instant any series is.
    """
    runs = _selected_runs(result, policies)
    timelines = [_timeline(r) for r in runs]
    end = max(
        [t for tl in timelines for t, *_ in tl]
        + [a.finish for r in runs for a in getattr(r, "apps", ()) if not a.rejected],
        default=0.0,
    )
    begin = min([t for tl in timelines for t, *_ in tl], default=0.0)
    start = time.time() - end if start_unix is None else start_unix
    if start + begin < 0:
        raise ValueError(f"start_unix {start} puts the run's first sample before 1970")
    namespaces, samples = _runs_samples(runs, namespace_prefix, start, step_s)
    # The simulator's build_info at every instant any run wrote, as a scraped exporter would show it.
    build = {"component": Component.SIMULATOR.value, "version": tessera.__version__}
    for ts in sorted({s.timestamp for s in samples}):
        samples.append(Sample("tessera_build_info", build, 1.0, ts))
    log.info("what-if run: namespaces %s, %.1f h of simulated time", sorted(namespaces), (end - begin) / 3600)
    return write_openmetrics(samples, path)


def _selected_runs(result: TrainingRuns, policies: Sequence[str] | None) -> list[object]:
    runs = list(result.runs)
    if policies is not None:
        known = [str(getattr(r, "policy", "?")) for r in runs]
        missing = [p for p in policies if p not in known]
        if missing:
            raise ValueError(f"no run for policies {missing}; the result has {known}")
        runs = [r for r in runs if getattr(r, "policy", None) in set(policies)]
    if not runs:
        raise ValueError("the result has no runs to export")
    return runs


def _runs_samples(
    runs: Sequence[object], namespace_prefix: str, start: float, step_s: float
) -> tuple[dict[str, str], list[Sample]]:
    """Each run's samples under its own namespace (namespace → policy); the label-free rounds counter
    from the first Themis run only."""
    namespaces: dict[str, str] = {}
    samples: list[Sample] = []
    rounds_from: str | None = None
    for run in runs:
        policy = str(getattr(run, "policy"))  # noqa: B009 - runs are duck-typed SimRuns
        ns = policy_namespace(namespace_prefix, policy)
        if ns in namespaces:
            raise ValueError(f"policies {namespaces[ns]!r} and {policy!r} both map to namespace {ns!r}")
        namespaces[ns] = policy
        run_samples = training_samples(run, ns, start, step_s=step_s)  # type: ignore[arg-type]
        is_auction = policy.startswith("themis")
        if not is_auction or rounds_from is not None:
            if is_auction:
                log.warning(
                    "tessera_auction_rounds_total is label-free: writing %s's rounds, not %s's "
                    "(pick one with policies=)",
                    rounds_from,
                    policy,
                )
            run_samples = [s for s in run_samples if s.name != "tessera_auction_rounds_total"]
        else:
            rounds_from = policy
        samples.extend(run_samples)
    return namespaces, samples
