"""The simulator and runtimes: iteration times, restart cost, successive halving, lease invariants."""

import random
from pathlib import Path

import pytest
import yaml
from tessera.cluster import Cluster, Sensitivity
from tessera.policy.baselines import Gandiva
from tessera.policy.themis import Themis, ThemisConfig
from tessera.policy.themis.estimate import HalvingPlan
from tessera.sim.scenario import ScenarioError
from tessera.sim.training.runtime import GangJobsRuntime, Job, SuccessiveHalvingRuntime
from tessera.sim.training.scenario import load, run
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import Trace, TraceApp, TraceJob

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "scenarios"
C = Cluster.build([(1, 4), (1, 4)])


def test_single_job_alone_runs_at_eq1_speed_plus_one_restart() -> None:
    spec = TraceApp("a", 0.0, (TraceJob(1000, 2.0, 4),), Sensitivity(), False)
    r = simulate(Themis(), C, Trace([spec]), random.Random(0), SimConfig(restart_s=30, round_gap_s=0))
    (o,) = r.apps
    assert o.finish == pytest.approx(30 + 1000 * 2.0 / 4)  # one machine → S = 1
    # ρ = T_sh / (T_cluster × N_avg) with T_cluster = 2000 / 4.
    assert o.rho == pytest.approx((30 + 500) / 500)
    assert r.gpu_seconds == pytest.approx(4 * o.finish)


def test_spread_gang_pays_the_cross_machine_slowdown() -> None:
    rt = GangJobsRuntime(C, [Job("j", 100, 1.0, 8, Sensitivity(cross_machine=1.29))], restart_s=0)
    rt.set_gpus(0.0, frozenset(C.gpu_ids))
    assert rt.next_event() == pytest.approx(100 * 1.29 / 8)
    assert rt.placement_scores == [pytest.approx(1 / 1.29)]


def test_lease_change_costs_a_restart_only_when_gpus_change() -> None:
    rt = GangJobsRuntime(C, [Job("j", 100, 1.0, 2, Sensitivity())], restart_s=10)
    g = frozenset(C.gpu_ids[:2])
    rt.set_gpus(0.0, g)
    assert rt.next_event() == pytest.approx(10 + 50)
    rt.set_gpus(20.0, g)  # same GPUs again: no restart
    assert rt.next_event() == pytest.approx(60)
    rt.set_gpus(30.0, frozenset(C.gpu_ids[4:6]))  # moved: checkpoint/restart
    assert rt.next_event() == pytest.approx(30 + 10 + (100 - 40) / 2)


def test_successive_halving_phases_keep_the_best_configs() -> None:
    plan = HalvingPlan(4, (8, 16, 36), 1)
    jobs = [
        Job(f"c{i}", 0, t, 1, Sensitivity(), score=s)
        for i, (t, s) in enumerate(((80, 1), (100, 4), (100, 2), (120, 3)))
    ]
    rt = SuccessiveHalvingRuntime(C, jobs, plan, restart_s=0)
    # The paper's 2-GPU bid with the job cap at 1: 1600 + 1600 + 100 × 36 = 6800.
    assert rt.remaining_time(2, 1.0) == pytest.approx(6800)
    rt.set_gpus(0.0, frozenset(C.gpu_ids[:4]))
    t = 0.0
    while not rt.done():
        t = rt.next_event()
        rt.advance(t)
    # Phase 1: slowest config 120 × 8; phase 2 keeps scores 4 and 3 (100 s, 120 s): 120 × 16;
    # phase 3 keeps the 100 s config: 100 × 36.
    assert t == pytest.approx(960 + 1920 + 3600)
    assert [j.name for j in rt.jobs] == ["c1"]


@pytest.mark.parametrize("policy", [Themis(ThemisConfig(lease_s=120)), Gandiva(lease_s=120)])
def test_no_gpu_is_ever_held_twice_and_all_apps_finish(policy) -> None:  # type: ignore[no-untyped-def]
    sc = load(
        yaml.safe_load((EXAMPLES / "training-small.yaml").read_text()), str(EXAMPLES / "training-small.yaml")
    )
    r = simulate(policy, sc.cluster, sc.resolved_trace(), random.Random(0), sc.sim, keep_records=True)
    assert len(r.apps) == 4 and all(a.finish >= a.arrival for a in r.apps)
    if isinstance(policy, Themis):
        assert r.records and all(
            set(p) >= {"app", "payment", "pf", "won"} for rec in r.records for p in rec["participants"]
        )


def test_scenario_runs_every_policy(tmp_path: Path) -> None:
    src = EXAMPLES / "training-small.yaml"
    res = run(load(yaml.safe_load(src.read_text()), str(src)), workers=1)
    assert [s.policy for s in res.summaries] == ["themis", "themis-f0", "tiresias", "gandiva", "drf"]
    assert "max ρ" in res.table()
    js = res.to_json()
    assert {p["policy"] for p in js["policies"]} == {"themis", "themis-f0", "tiresias", "gandiva", "drf"}
    paths = res.plots(tmp_path)
    assert {p.name for p in paths} == {"rho_cdf.png", "gpu_hours.png", "placement_cdf.png"}
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({"colour": 1}, "colour", "unknown field"),
        ({"cluster": {"preset": "tiny"}}, "cluster.preset", "unknown preset"),
        (
            {"cluster": {"machines": [{"count": 0, "gpus_per_slot": 2}]}},
            "cluster.machines[0].count",
            "integer >= 1",
        ),
        ({"policies": ["themis", "magic"]}, "policies[1].policy", "unknown 'magic'"),
        ({"policies": [{"policy": "themis", "fairness_knob": 2}]}, "policies[0]", "fairness_knob"),
        ({"themis": {"lease": 5}}, "themis.lease", "unknown field"),
        ({"trace": {"file": "missing.csv"}}, "trace.file", "file not found"),
        ({"trace": {"generate": {"apps": 0}}}, "trace.generate.apps", "integer >= 1"),
        ({"sim": {"restart_s": -1}}, "sim", "restart_s"),
        ({"sim": {"estimate_error": 1.5}}, "sim", "estimate_error"),
        (
            {"sim": {"reported_sensitivity": {"app-0": {"cross_machine": 0.5}}}},
            "sim.reported_sensitivity",
            "cross_machine must be >= 1.0",
        ),
        ({"policies": ["themis", "themis"]}, "policies", "labels must be unique"),
    ],
)
def test_bad_scenarios_name_file_field_and_problem(data: dict, field: str, problem: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ScenarioError) as e:
        load({"kind": "training", **data}, "/tmp/bad.yaml")
    assert e.value.source == "/tmp/bad.yaml"
    assert e.value.field == field
    assert problem in e.value.problem


def test_scenario_reads_a_misreporting_app() -> None:
    sc = load(
        {"kind": "training", "sim": {"reported_sensitivity": {"app-0": {"cross_machine": 2.0}}}}, "x.yaml"
    )
    assert dict(sc.sim.reported_sensitivity)["app-0"].cross_machine == 2.0
