"""The bundled multi-team scenario: Tessera's queues against the KAI-style and Kueue-style baselines, held
to the issue's bar (`tessera simulate examples/scenarios/multi-team.yaml` prints the same table)."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest
import yaml
from tessera.sim.training import scenario as training

SCENARIO = Path(__file__).resolve().parents[3] / "examples/scenarios/multi-team.yaml"
LEASE_S = 600.0


@cache
def figures() -> dict[str, dict[str, object]]:
    sc = training.load(yaml.safe_load(SCENARIO.read_text()), str(SCENARIO))
    result = training.run(sc)
    return {r.policy: r.queues for r in result.runs}


def test_every_policy_reports_queue_figures() -> None:
    f = figures()
    assert set(f) == {"tessera", "kai-style", "kueue-style", "kueue-defaults"}
    for row in f.values():
        assert set(row["max_rho"]) == {"team-a", "team-b", "team-c"}  # type: ignore[arg-type]


def test_no_guarantee_violation_longer_than_one_lease() -> None:
    assert figures()["tessera"]["longest_violation_s"] <= LEASE_S  # type: ignore[operator]


def test_under_immediate_reclaim_no_violation_outlasts_the_checkpoint_grace() -> None:
    # Every queue lending under `immediate` with no minimum runtime: a queue owed GPUs gets them in a round
    # run at once, not one round gap (60 s) later — the spell was 55 s before, above the 30 s grace.
    raw = yaml.safe_load(SCENARIO.read_text())
    for q in raw["queues"]:
        q.update(reclaim="immediate", min_runtime_s=0, grace_s=30)
    sc = training.load(raw, str(SCENARIO))
    ours = [p for p in sc.policies if p.label == "tessera"]
    run = training.run(dataclasses.replace(sc, policies=tuple(ours)), workers=1).runs[0]
    assert run.queues["longest_violation_s"] <= 30  # type: ignore[operator]


def test_worst_per_queue_max_rho_is_lower_than_each_baseline() -> None:
    f = figures()
    ours = f["tessera"]["worst_max_rho"]
    assert ours < f["kai-style"]["worst_max_rho"]  # type: ignore[operator]
    assert ours < f["kueue-style"]["worst_max_rho"]  # type: ignore[operator]


def test_allocation_is_at_least_the_best_baselines() -> None:
    f = figures()
    assert f["tessera"]["utilisation"] >= max(f[p]["utilisation"] for p in ("kai-style", "kueue-style"))  # type: ignore[operator,type-var]


@pytest.mark.xfail(
    strict=True,
    reason="under contention Themis' leases still move GPUs between apps (renewal in place keeps only the "
    "uncontended ones where they were) and every move costs the restart time: useful utilisation comes out "
    "0.1 % below the baselines' on this scenario (0.6238 against 0.6244)",
)
def test_useful_utilisation_is_at_least_the_best_baselines() -> None:
    f = figures()
    assert f["tessera"]["useful"] >= max(f[p]["useful"] for p in ("kai-style", "kueue-style"))  # type: ignore[operator,type-var]


SEEDS = range(1, 7)


@cache
def tessera_worst_rho_by_seed() -> dict[int, float]:
    """Tessera's worst per-queue max ρ for seeds 1–6 (the seed drives Themis' random leftovers; the
    baselines draw nothing, so one run each stands for every seed)."""
    sc = training.load(yaml.safe_load(SCENARIO.read_text()), str(SCENARIO))
    ours = [p for p in sc.policies if p.label == "tessera"]
    out = {}
    for seed in SEEDS:
        result = training.run(dataclasses.replace(sc, seed=seed, policies=tuple(ours)), workers=1)
        out[seed] = float(result.runs[0].queues["worst_max_rho"])
    return out


@pytest.mark.slow
def test_worst_max_rho_over_seeds_is_lower_than_each_baseline_on_average() -> None:
    f = figures()
    by_seed = tessera_worst_rho_by_seed()
    mean = sum(by_seed.values()) / len(by_seed)
    assert mean < f["kai-style"]["worst_max_rho"]  # type: ignore[operator]
    assert mean < f["kueue-style"]["worst_max_rho"]  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="not for every seed: with seeds 4 and 6 Themis' random leftovers leave team-b's worst App at "
    "ρ 1.27 and 1.26, above the Kueue-style baseline's 1.25 (below KAI-style's 1.30)",
)
def test_worst_max_rho_is_lower_than_each_baseline_for_every_seed() -> None:
    f = figures()
    best = min(f[p]["worst_max_rho"] for p in ("kai-style", "kueue-style"))  # type: ignore[type-var]
    assert all(v < best for v in tessera_worst_rho_by_seed().values())  # type: ignore[operator]


def test_kueue_with_its_default_reclaim_never_leaves_a_guarantee_unmet_until_borrowers_finish() -> None:
    # Kueue's defaults (BestEffortFIFO, reclaimWithinCohort: Never) preempt nothing: a guarantee lent to a
    # burst comes back only as the borrowers' workloads end (an hour here, 7,620 GPU-seconds short in all),
    # where the `Any` configuration takes it back at once.
    f = figures()
    assert f["kueue-style"]["violation_gpu_s"] == 0
    assert f["kueue-defaults"]["longest_violation_s"] > 4 * LEASE_S  # type: ignore[operator]


def test_a_queue_baseline_refuses_fields_it_does_not_read() -> None:
    from tessera.sim.scenario import ScenarioError

    raw = {"kind": "training", "queues": [{"name": "a", "guaranteed": 2}]}
    with pytest.raises(ScenarioError, match=r"policies\[0\]\.queueing_strategy.*not a kai-style field"):
        training.load({**raw, "policies": [{"policy": "kai-style", "queueing_strategy": "StrictFIFO"}]}, "x")
    with pytest.raises(ScenarioError, match=r"policies\[0\]\.lease_s.*known: queueing_strategy"):
        training.load({**raw, "policies": [{"policy": "kueue-style", "lease_s": 60}]}, "x")
    sc = training.load(
        {**raw, "policies": [{"policy": "kueue-style", "label": "k", "reclaim_within_cohort": "Never"}]}, "x"
    )
    assert sc.policies[0].build().name == "k"
