"""The measures of tests/bench/bench_kueue_side_by_side.py, on hand-worked timelines: what both sides (Tessera's
queues and the real Kueue) are judged by must be right before any figure of that bench means anything."""

from __future__ import annotations

import json
import math

import pytest
from tessera.api import contract

from tests.bench.bench_kueue_side_by_side import (
    KUEUE_GPU,
    SCENARIO,
    JobRun,
    Meter,
    Team,
    Work,
    figures,
    kueue_objects,
    load,
    n_avg,
    perturbed,
    pool_nodes,
    row,
    summary,
    vars_of,
)

A = Team("a", guaranteed=4, max=8, weight=1.0, reclaim="atLeaseEnd", min_runtime_s=0.0)
B = Team("b", guaranteed=4, max=None, weight=1.0, reclaim="immediate", min_runtime_s=600.0)


def test_a_job_pauses_for_its_restart_then_runs_at_its_gpus_and_finishes_at_the_exact_time() -> None:
    j = JobRun(Work("x", "a", arrival=0.0, iterations=1000, iter_time=1.0, gpus=4))
    j.placed(10.0, frozenset({"p1"}), held=2, nodes=1, restart_s=30.0)
    j.advance(10.0, 100.0)  # paused until 40, then 2 iterations/s for 60 s
    assert j.done_iters == pytest.approx(120.0)
    j.placed(100.0, frozenset({"p2", "p3"}), held=4, nodes=2, restart_s=30.0)  # moved: restart, across nodes
    assert j.rate == pytest.approx(4 / 1.1)
    j.advance(100.0, 10_000.0)
    # 880 iterations left at 4/1.1 per s from 130: 130 + 242 = 372
    assert j.finished_at == pytest.approx(130.0 + 880 * 1.1 / 4)
    assert j.done_iters == 1000
    assert j.restarts == 2 and j.first_start == 10.0


def test_a_job_without_pods_makes_no_progress_and_keeps_what_it_did() -> None:
    j = JobRun(Work("x", "a", 0.0, 100, 1.0, 1))
    j.placed(0.0, frozenset({"p"}), held=1, nodes=1, restart_s=0.0)
    j.advance(0.0, 40.0)
    j.placed(40.0, frozenset(), held=0, nodes=0, restart_s=0.0)  # preempted: its checkpoint keeps 40
    j.advance(40.0, 500.0)
    assert j.done_iters == pytest.approx(40.0) and j.finished_at is None


def test_the_meter_counts_shortfall_below_the_guarantee_spells_and_borrowing() -> None:
    meter = Meter((A, B))
    a1 = JobRun(Work("a1", "a", 0.0, 10**6, 1.0, 8), created=True)
    b1 = JobRun(Work("b1", "b", 0.0, 10**6, 1.0, 2), created=True)
    a1.held, b1.held = 8, 0
    meter.sample(0.0, [a1, b1])
    # A sample integrates the GPUs held since the last one: the trainer samples before it takes in the pods
    # it just listed. b is short by min(4, 2) - 0 = 2 from 0 to 160, then gets its 2 GPUs.
    meter.sample(100.0, [a1, b1])
    meter.sample(160.0, [a1, b1])
    b1.held = 2
    meter.sample(200.0, [a1, b1])  # b met over [160, 200]: its spell (0 → 160) ends
    meter.close()
    assert meter.violation_gpu_s == {"b": pytest.approx(2 * 160.0)}
    assert meter.spells == {"b": [pytest.approx(160.0)]}
    assert meter.borrowed_gpu_s["a"] == pytest.approx(4 * 200.0)
    assert meter.held_gpu_s == pytest.approx(8 * 200 + 2 * 40)


def test_n_avg_is_the_mean_number_of_the_queues_apps_alive_during_an_apps_life() -> None:
    w = Work("x", "a", 0.0, 1, 1.0, 1)
    lives = [("a", 0.0, 100.0), ("a", 50.0, 150.0), ("b", 0.0, 100.0)]
    assert n_avg(w, 100.0, lives) == pytest.approx(1.5)  # itself all along, the other half the time


def test_figures_hold_each_app_to_its_queues_share_as_the_simulator_does() -> None:
    # 8 GPUs, a and b guaranteed 4 each: with both queues busy each queue's share is 4.
    sc = load(SCENARIO)
    sc = type(sc)((A, B), (), nodes=2, gpus_per_node=4, lease_s=600.0, restart_s=0.0)
    x = JobRun(Work("x", "a", 0.0, 3600, 1.0, 4), created=True, finished_at=1800.0)
    y = JobRun(Work("y", "b", 0.0, 3600, 1.0, 2), created=True, finished_at=3600.0)
    meter = Meter((A, B))
    f = figures("kueue", 1, sc, [x, y], meter)
    # x: T_id = 3600 / min(4 / 1, 4) = 900, JCT 1800: ρ 2; y: 3600 / min(4, 2) = 1800, JCT 3600: ρ 2.
    assert f.max_rho == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}
    assert f.useful == pytest.approx(7200 / (8 * 3600))
    assert f.avg_jct_h == pytest.approx(0.75) and f.unfinished == 0
    assert f.by_queue["a"].avg_jct_h == pytest.approx(0.5) and f.by_queue["b"].mean_rho == pytest.approx(2.0)


def test_a_seed_moves_arrivals_later_and_scales_work_the_same_way_every_time() -> None:
    apps = load(SCENARIO).apps
    assert perturbed(apps, 0, 600.0) == apps
    one, again = perturbed(apps, 3, 600.0), perturbed(apps, 3, 600.0)
    assert one == again != perturbed(apps, 4, 600.0)
    by = {w.app: w for w in apps}
    for w in one:
        assert 0 <= w.arrival - by[w.app].arrival <= 600.0
        assert 0.85 * by[w.app].iterations - 1 <= w.iterations <= 1.15 * by[w.app].iterations + 1


def test_kueue_gets_the_same_guarantees_and_maxima_with_its_default_preemption() -> None:
    sc = load(SCENARIO)
    objs = dict((o["metadata"]["name"], o) for _, o in kueue_objects(sc, "Never"))
    for team in sc.teams:
        spec = objs[team.name]["spec"]
        gpu = spec["resourceGroups"][0]["flavors"][0]["resources"][2]
        assert gpu == {"name": KUEUE_GPU, "nominalQuota": team.guaranteed} | (
            {"borrowingLimit": team.max - team.guaranteed} if team.max is not None else {}
        )
        assert spec["cohortName"] == "bench" and "preemption" not in spec
    any_ = dict((o["metadata"]["name"], o) for _, o in kueue_objects(sc, "Any"))
    assert any_["team-a"]["spec"]["preemption"] == {"reclaimWithinCohort": "Any"}


def test_the_two_pools_are_alike_but_only_tesseras_is_visible_to_tessera() -> None:
    sc = load(SCENARIO)
    t, k = pool_nodes(sc, "tessera"), pool_nodes(sc, "kueue")
    assert len(t) == len(k) == sc.nodes and sc.capacity == 32
    assert all(n["status"]["capacity"][contract.RESOURCE_GPU] == "4" for n in t)
    assert all(n["status"]["capacity"][KUEUE_GPU] == "4" for n in k)
    assert all(contract.RESOURCE_GPU not in n["status"]["capacity"] for n in k)
    assert all(contract.ANN_NODE_GPUS not in n["metadata"]["annotations"] for n in k)
    assert not math.isnan(sc.lease_s)


def test_the_report_has_a_row_per_side_and_seed_and_a_summary_per_queue() -> None:
    sc = load(SCENARIO)
    sc = type(sc)((A, B), (), nodes=2, gpus_per_node=4, lease_s=600.0, restart_s=0.0)
    results = []
    for seed, finish in ((1, 1800.0), (2, 2700.0)):
        got = {}
        for side in ("tessera", "kueue"):
            x = JobRun(Work("x", "a", 0.0, 3600, 1.0, 4), created=True, finished_at=finish)
            y = JobRun(Work("y", "b", 0.0, 3600, 1.0, 2), created=True, finished_at=3600.0)
            got[side] = figures(side, seed, sc, [x, y], Meter((A, B)))
        results.append(got)
    assert row(results[0]["kueue"]).startswith("| 1 | kueue | 0 |")
    text = summary(results)
    assert "| a | tessera | 0 | 0 | 0 | 0.0 | 2.50 |" in text  # ρ 2 and 3: mean 2.5
    assert "below Kueue's on 0 of 2 seeds" in text
    assert json.loads(json.dumps(vars_of(results[0]["tessera"])))["by_queue"]["b"]["max_rho"] == 2.0
