"""Tuning apps in a training trace: the `tuning` block, its errors, and `tessera simulate` running Fluid
inside each policy's leases (two-level scheduling)."""

import json
import random
from pathlib import Path

import pytest
from tessera.cli import main
from tessera.cluster import Cluster
from tessera.policy.baselines import BASELINES
from tessera.sim.training.simulator import simulate
from tessera.sim.training.trace import TraceError, parse_apps
from tessera.sim.tuning.app_spec import TuningAppSpec
from tessera.sim.tuning.engine import TuningSim
from tessera.sim.tuning.experiments import make_algorithm
from tessera.sim.tuning.workload import TuningWorkload

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "scenarios"


def test_tuning_block_defaults_and_round_trip() -> None:
    trace = parse_apps("t", [{"id": "tune", "arrival": 5, "tuning": {"algorithm": "asha", "seed": 3}}], 16)
    spec = trace.apps[0]
    t = spec.tuning
    assert t is not None and spec.jobs == () and spec.work == 0.0
    assert (t.algorithm, t.seed, t.max_gpus, t.samples, t.max_budget) == ("asha", 3, None, 40, 27)
    assert (t.fluid.max_pack, t.fluid.max_workers, t.epsilon_given) == (2, 4, False)
    again = parse_apps("t", trace.to_dict()["apps"], 16).apps[0]
    assert again.tuning == t
    custom = TuningAppSpec.parse({"workload": {"iter_time": 30, "alpha": 1.3}, "fluid": {"epsilon": 2.0}})
    assert custom.workload.iter_time == 30 and custom.workload.alpha == 1.3 and custom.epsilon_given
    assert TuningAppSpec.parse(custom.to_dict()) == custom


@pytest.mark.parametrize(
    ("tuning", "field", "problem"),
    [
        ({"algorithm": "sgd"}, "apps[0].tuning.algorithm", "unknown 'sgd'"),
        ({"max_gpus": 32}, "apps[0].tuning.max_gpus", "the cluster has 16"),
        ({"samples": 0}, "apps[0].tuning.samples", "integer >= 1"),
        ({"workload": {"lr": 1}}, "apps[0].tuning.workload.lr", "unknown field"),
        ({"workload": {"alpha": 0.5}}, "apps[0].tuning.workload", "alpha"),
        ({"fluid": {"max_pack": 0}}, "apps[0].tuning.fluid", "max_pack (c)"),
        ({"budget": 3}, "apps[0].tuning.budget", "unknown field"),
        ("asha", "apps[0].tuning", "must be a mapping"),
    ],
)
def test_bad_tuning_block_names_the_field(tuning: object, field: str, problem: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_apps("trace.yaml", [{"id": "x", "arrival": 0, "tuning": tuning}], 16)
    assert e.value.field == field and problem in e.value.problem, str(e.value)


def test_tuning_app_with_jobs_is_refused() -> None:
    rec = {"arrival": 0, "tuning": {}, "jobs": [{"iterations": 1, "iter_time": 1, "gpus": 1}]}
    with pytest.raises(TraceError, match=r"apps\[0\]\.jobs: a tuning app has no jobs"):
        parse_apps("t", [rec], 16)


@pytest.mark.parametrize("policy", ["themis", *BASELINES])
def test_every_policy_runs_a_tuning_app_to_the_end(policy: str) -> None:
    from tessera.policy.themis import Themis

    cluster = Cluster.homogeneous(2, 4)
    trace = parse_apps(
        "t",
        [
            {"id": "train", "arrival": 0, "jobs": [{"iterations": 2000, "iter_time": 1.0, "gpus": 4}]},
            {"id": "tune", "arrival": 60, "tuning": {"algorithm": "hyperband", "seed": 1, "max_gpus": 4}},
        ],
        len(cluster),
    )
    p = Themis() if policy == "themis" else BASELINES[policy]()
    run = simulate(p, cluster, trace, random.Random(0))
    tune = next(a for a in run.apps if a.app_id == "tune")
    assert not tune.rejected and tune.best_score is not None
    # The same algorithm alone on a fixed 4-GPU pool finds the same best config: leases change timing,
    # not Hyperband's (synchronous) decisions.
    w = TuningWorkload(seed=1)  # the block's default workload with the app's seed
    alone = TuningSim(cluster, cluster.gpu_ids[:4], w, make_algorithm("hyperband", w, 1), "fluid").run()
    assert tune.best_score == pytest.approx(alone.best_score)
    assert tune.finish - tune.arrival >= 0.99 * alone.makespan  # sharing never beats owning the GPUs


def test_scenario_adds_tuning_apps_and_reports_them(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", str(EXAMPLES / "two-level.yaml"), "--no-progress", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["apps"] == 22  # 20 generated + 2 tuning
    for policy, apps in out["apps"].items():
        tuning = {a["app"]: a for a in apps if "best_score" in a}
        assert set(tuning) == {"tune-hyperband", "tune-asha"}, policy
        assert all(a["time_to_target_s"] > 0 and a["best_score"] > 0.85 for a in tuning.values())
    assert main(["simulate", str(EXAMPLES / "two-level.yaml"), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "tuning apps (Fluid inside each policy's leases):" in table
    assert table.count("tune-asha ") == 4  # one line per policy


def test_scenario_errors_name_the_added_app_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: training\npolicies: [themis]\n"
        "trace: {generate: {apps: 3}, apps: [{id: t, arrival: 0, tuning: {algorithm: nope}}]}\n"
    )
    assert main(["simulate", str(bad)]) == 2
    assert f"{bad}: trace.apps[0].tuning.algorithm: unknown 'nope'" in capsys.readouterr().err
    bad.write_text(
        "kind: training\npolicies: [themis]\n"
        "trace: {generate: {apps: 3}, apps: [{id: app-0001, arrival: 0, tuning: {}}]}\n"
    )
    assert main(["simulate", str(bad), "--no-progress"]) == 2
    assert f"{bad}: trace.apps: app id 'app-0001' is already in the trace" in capsys.readouterr().err


def test_a_rejected_tuning_app_is_reported_as_rejected() -> None:
    from tessera.policy.themis import Themis
    from tessera.sim.training.report import TrainingResult
    from tessera.sim.training.simulator import SimConfig

    cluster = Cluster.homogeneous(1, 8)
    trace = parse_apps(
        "t",
        [
            {"id": "train", "arrival": 0, "jobs": [{"iterations": 2000, "iter_time": 1.0, "gpus": 8}]},
            {"id": "tune", "arrival": 10, "tuning": {"max_gpus": 4}},
        ],
        len(cluster),
    )
    run = simulate(Themis(), cluster, trace, random.Random(0), SimConfig(admission_threshold=1.0))
    tune = next(a for a in run.apps if a.app_id == "tune")
    assert tune.rejected and tune.tuning and tune.best_score is None
    result = TrainingResult("t", [run])
    assert "tune             themis     rejected by admission control" in result.table()
    (entry,) = [a for a in result.to_json()["apps"]["themis"] if a["app"] == "tune"]
    assert entry["rejected"] and entry["best_score"] is None and entry["time_to_target_s"] is None


@pytest.mark.parametrize("algorithm", ["asha", "bohb", "hyperband", "pbt"])
def test_a_tuning_app_without_gpus_bids_with_the_trials_it_would_run(algorithm: str) -> None:
    # An asynchronous tuner launches trials only into free slots; before its first lease it has none, and
    # it used to bid as a finished app (demand 1, no work). It now sizes its first trials by max_gpus.
    from tessera.sim.training.simulator import SimConfig, make_runtime

    cluster = Cluster.homogeneous(2, 4)
    spec = parse_apps("t", [{"id": "x", "arrival": 0, "tuning": {"algorithm": algorithm, "max_gpus": 8}}], 8)
    rt = make_runtime(spec.apps[0], cluster, SimConfig())
    rt.advance(0.0)
    assert rt.demand() == 8 and rt.total_work() > 0
    assert 0 < rt.remaining_time(8, 1.0) < rt.remaining_time(2, 1.0)
    assert rt.used_gpus() == frozenset()
    rt.set_gpus(0.0, frozenset(cluster.gpu_ids[:2]))  # a small first lease: Fluid packs c = 2 per GPU
    assert rt.used_gpus() == frozenset(cluster.gpu_ids[:2])
    assert rt.sim.result().peak_trials_per_gpu == 2
