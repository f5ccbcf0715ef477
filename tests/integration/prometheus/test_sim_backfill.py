"""A what-if run in Prometheus: a real training simulation written as OpenMetrics, backfilled with the real
promtool into a TSDB, served by the real Prometheus, and every Fairness dashboard query evaluated at
instants inside the run (issue 10).

Queries whose metric a training timeline cannot give (tessera.sim.metrics_export.TRAINING_NOT_DERIVED:
lease changes, auction round duration, pending pods) must return nothing; every other Fairness query must
return data.
"""

from __future__ import annotations

import math
import random
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tessera.sim.metrics_export import TRAINING_NOT_DERIVED, policy_namespace, write_training_openmetrics
from tessera.sim.training.scenario import load, run
from tessera.sim.training.simulator import AppOutcome, SimRun, simulate

from tests.requires import missing

from .prom_server import PrometheusServer, prometheus_binary, promtool_binary
from .promql_scan import dashboard_metrics, dashboard_queries

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "examples" / "scenarios" / "training-small.yaml"
START = 1_700_000_000.0  # a fixed wall-clock start: the queries below name exact instants


@dataclass
class _RunWithTimeline:
    policy: str
    apps: list[AppOutcome]
    rho_timeline: list[tuple[float, str, float, int]]


@dataclass
class _Result:
    runs: list[Any]


def _with_timeline(r: SimRun) -> Any:
    """The run itself once the simulator records `rho_timeline`. Until then, a stand-in with the run's real
    outcomes and a timeline taken from its real auction records: each round's time and each bidder's
    current ρ; the GPUs are those it won in that round (the records do not hold GPUs held)."""
    if getattr(r, "rho_timeline", None):
        return r
    timeline = [
        (
            float(rec["now"]),
            p["app"],
            float(p["rho_current"]),
            len(p["won"]) + len(rec["leftover_grants"].get(p["app"], [])),
        )
        for rec in r.records
        for p in rec["participants"]
    ]
    assert timeline, f"run {r.policy} recorded no auction rounds"
    return _RunWithTimeline(r.policy, r.apps, timeline)


@pytest.fixture(scope="module")
def result() -> Any:
    data = yaml.safe_load(SCENARIO.read_text())
    data["policies"] = ["themis"]
    sc = load(data, str(SCENARIO))
    if "rho_timeline" not in SimRun.__dataclass_fields__:
        policy = sc.policies[0].build()
        sim = simulate(
            policy, sc.cluster, sc.resolved_trace(), random.Random(sc.seed), sc.sim, keep_records=True
        )
        return _Result([_with_timeline(sim)])
    return run(sc, workers=1)


@pytest.fixture
def backfilled(tmp_path: Path, result: Any) -> Iterator[tuple[PrometheusServer, Any]]:
    prometheus, promtool = prometheus_binary(), promtool_binary()
    if prometheus is None or promtool is None:
        missing("prometheus/promtool not on PATH; install them with: bash hack/install-test-deps.sh")
    om = tmp_path / "run.om"
    n = write_training_openmetrics(result, om, start_unix=START)
    assert n > 0
    data = tmp_path / "tsdb"
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"promtool backfill failed:\n{done.stdout}\n{done.stderr}"
    server = PrometheusServer(
        prometheus,
        tmp_path / "prometheus",
        {},
        storage_path=data,
        # Keep a run from 2023 (retention counts back from now) and bridge the gaps between arbiter rounds.
        extra_args=("--storage.tsdb.retention.time=100y", "--query.lookback-delta=1h"),
    )
    try:
        server.wait_ready()
        yield server, result
    finally:
        server.stop()


def _fairness_queries() -> Sequence[tuple[str, str, str]]:
    return [
        (where, expr, promql) for file, where, expr, promql in dashboard_queries() if file == "fairness.json"
    ]


@pytest.mark.slow
def test_every_fairness_query_answers_inside_the_backfilled_run(
    backfilled: tuple[PrometheusServer, Any],
) -> None:
    server, result = backfilled
    (r,) = [x for x in result.runs]
    ns = policy_namespace("sim", r.policy)
    done = sorted((a for a in r.apps if not a.rejected), key=lambda a: a.finish)
    rounds = sorted({t for t, *_ in r.rho_timeline})
    # Two instants: 30 s after the first round (Apps running, none finished; rate() over the dashboard's
    # 30 s window has two counter points) and just after the first finish (T_shared known).
    assert rounds[1] - rounds[0] > 30
    instants = [START + rounds[0] + 30, START + done[0].finish + 1]
    assert instants[0] < instants[1] <= START + max(a.finish for a in done)

    queries = _fairness_queries()
    assert len(queries) >= 10
    empty, unexpected = [], []
    for where, expr, promql in queries:
        not_derived = dashboard_metrics(expr) & set(TRAINING_NOT_DERIVED)
        got = [server.query(promql, at) for at in instants]
        if not_derived:
            if any(g and not (len(g) == 1 and g[0]["value"][1] == "0") for g in got):
                unexpected.append(f"{where}: {expr}")
        elif not got[1] or (not got[0] and "t_shared" not in expr and "t_independent" not in expr):
            empty.append(f"{where}: {expr}")
    assert not empty, "Fairness queries without data inside the run:\n" + "\n".join(empty)
    assert not unexpected, "queries on series the simulator cannot derive returned data:\n" + "\n".join(
        unexpected
    )

    # Values, not just presence: ρ and GPUs at the first round are what the timeline says.
    first = [(app, rho, gpus) for t, app, rho, gpus in r.rho_timeline if t == rounds[0]]
    rho = {s["metric"]["app"]: float(s["value"][1]) for s in server.query("tessera_app_rho", instants[0])}
    assert rho == pytest.approx({app: v for app, v, _ in first if math.isfinite(v)})
    gpus = server.query(f'tessera_namespace_gpus{{namespace="{ns}",workload="training"}}', instants[0])
    assert float(gpus[0]["value"][1]) == sum(g for *_, g in first)
    # The realised ρ of the first App to finish is T_shared / T_independent as written.
    app = done[0].app_id
    t_sh = server.query(f'tessera_app_t_shared_seconds{{app="{app}"}}', instants[1])
    t_id = server.query(f'tessera_app_t_independent_seconds{{app="{app}"}}', instants[1])
    assert float(t_sh[0]["value"][1]) == pytest.approx(done[0].finish - done[0].arrival, rel=1e-9)
    assert float(t_sh[0]["value"][1]) / float(t_id[0]["value"][1]) == pytest.approx(done[0].rho, rel=1e-9)
    # The namespace variable offers the policy's namespace.
    assert ns in server.label_values("namespace")
