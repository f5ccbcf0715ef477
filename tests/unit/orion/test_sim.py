"""The kernel-level sharing model against Orion's findings (B.9 shape; spec E.5-style directional checks).

Run once per module: Fig. 7's ResNet50 bar (ResNet50 inference HP at 15 rps Poisson beside each of the five
Table 3 training jobs as BE, two seeds, averaged as the paper averages), one inf-train pair (ResNet50 HP +
ResNet50 training BE, seed 0) for the ablation and the node policy, and one inf-inf set (ResNet50 HP beside
each other model as BE inference). Kernel mixes are synthetic. Each finding is its own test; findings the
model does not show are strict xfails that say what differs.
"""

from __future__ import annotations

import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from tessera.policy.orion.profiles import cost_saving
from tessera.sim.orion.experiment import (
    ABLATION,
    INF_INF_RPS,
    INF_TRAIN_RPS,
    TRAINING_JOBS,
    Collocation,
    ExperimentResult,
    run_experiment,
)
from tessera.sim.orion.gpu import ClientSpec, GpuSim
from tessera.sim.orion.kernels import BN2D, CONV2D, MODELS, mix, summary
from tessera.sim.orion.schedulers import FreeForAll

_MODEL_GAPS = (
    "Remaining differences: synthetic kernel mixes shaped by Table 1 instead of traces, a V100 model whose only "
    "interference is SM queueing and bandwidth overload (no caches, launch queues, memcpy periods or GIL), REEF-N "
    "implemented from the REEF paper's rules as the Orion authors did (queue of 12)"
)
FIG7_POLICIES = ("dedicated", "temporal", "mps", "streams", "reef", "orion")
FIG7_SEEDS = (0, 1)


def _fig7_workloads() -> list[Collocation]:
    """The ResNet50 bar of Orion Fig. 7 exactly as ``tests/bench/bench_orion_inf_train.py --hp resnet50``
    measures it: ResNet50 inference HP at Table 3's 15 req/s Poisson beside each of the five BE training jobs,
    seeds 0 and 1, 400 measured requests after 20."""
    return [
        Collocation(be_models=(be,), rate_rps=INF_TRAIN_RPS["resnet50"], requests=400, seed=seed)
        for be in TRAINING_JOBS
        for seed in FIG7_SEEDS
    ]


@pytest.fixture(scope="module")
def fig7_runs() -> list[ExperimentResult]:
    """The ten runs of the ResNet50 bar, in two processes (spawn: no threads of the test process copied
    mid-lock); the ResNet50-training, seed-0 run also carries the node policy and the ablation steps."""
    ws = _fig7_workloads()
    extra = ("tessera", "tessera-caps", "priorities", "orion-profiles")
    pols = [FIG7_POLICIES + (extra if w.be_models == ("resnet50",) and w.seed == 0 else ()) for w in ws]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_experiment, ws, pols))


@pytest.fixture(scope="module")
def fig7_resnet50(fig7_runs: list[ExperimentResult]) -> dict[str, dict[str, float]]:
    """HP p99 / dedicated per policy: per BE job the mean over the seeds, and under ``"mean"`` the average
    over the five jobs, as Fig. 7's bar averages them (Orion §6.2.1)."""
    out: dict[str, dict[str, float]] = {}
    for be in TRAINING_JOBS:
        mine = [r for r in fig7_runs if r.workload.be_models == (be,)]
        out[be] = {p: statistics.mean(r.results[p].ratio_p99 for r in mine) for p in FIG7_POLICIES}
    out["mean"] = {p: statistics.mean(out[be][p] for be in TRAINING_JOBS) for p in FIG7_POLICIES}
    return out


@pytest.fixture(scope="module")
def inf_train(fig7_runs: list[ExperimentResult]) -> ExperimentResult:
    """One inf-train pair: ResNet50 inference HP + ResNet50 training BE, seed 0 (as
    examples/scenarios/orion-inf-train.yaml, which also caps Tessera's BE lane at 50 %)."""
    return next(r for r in fig7_runs if r.workload.be_models == ("resnet50",) and r.workload.seed == 0)


@pytest.fixture(scope="module")
def train_train() -> ExperimentResult:
    w = Collocation(
        hp_model="bert", hp_role="training", be_models=("mobilenetv2",), requests=20, warmup_requests=2
    )
    return run_experiment(w, ("dedicated", "mps", "reef", "tessera"))


def _pair(a, b) -> float:  # type: ignore[no-untyped-def]
    sim = GpuSim(
        [ClientSpec("a", False, (a,), arrivals=(0.0,)), ClientSpec("b", False, (b,), arrivals=(0.0,))],
        FreeForAll(),
    )
    sim.run(0.1)
    return max(lat for c in sim.clients for _, lat in c.latencies)


def test_table2_collocation_order() -> None:
    """Conv2d‖BN2d gains most, BN2d‖BN2d some, Conv2d‖Conv2d nothing (1.41 / 1.08 / 0.98, Orion Table 2)."""
    cb = (CONV2D.duration + BN2D.duration) / _pair(CONV2D, BN2D)
    bb = 2 * BN2D.duration / _pair(BN2D, BN2D)
    cc = 2 * CONV2D.duration / _pair(CONV2D, CONV2D)
    assert cb > bb > cc
    assert cc == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("key", sorted(MODELS))
def test_synthetic_mix_matches_its_table1_row(key: str) -> None:
    row = MODELS[key]
    s = summary(mix(row.model, row.role, seed=0))
    assert s["time_s"] == pytest.approx(row.time_s, rel=1e-6)
    assert s["compute"] == pytest.approx(row.compute, abs=0.05)
    assert s["membw"] == pytest.approx(row.membw, abs=0.05)


def test_deterministic() -> None:
    w = Collocation(requests=20, warmup_requests=2)
    a, b = run_experiment(w, ("mps", "orion")), run_experiment(w, ("mps", "orion"))
    assert [r.to_json() for r in a.results.values()] == [r.to_json() for r in b.results.values()]


@pytest.mark.xfail(
    strict=True,
    reason="paper: Orion keeps the HP inference p99 within 14 % of ideal in inf-train, on average (Orion §6.2.1, "
    "Fig. 7 Poisson; each bar averages the five BE training jobs, V100, 3 repetitions). The average over the "
    "bars reproduces (1.098x over all five HP models, tests/bench/bench_orion_inf_train.py); this test applies the "
    "bound to the one bar the suite can afford, ResNet50 (15 req/s Poisson beside each of the five Table 3 "
    "training jobs, 2 seeds x 400 requests, averaged the same way), and there the model gives 1.155x (1.163x with "
    "3 seeds x 1,000 requests), 1.21x beside ResNet101 and 1.24x beside BERT training. Likely cause, not "
    "isolated: Orion admits BE kernels while the HP is idle and nothing preempts them (Orion §5.1.2), so an HP "
    "request arriving then waits for long training kernels. " + _MODEL_GAPS,
)
def test_orion_resnet50_bar_within_14_percent_of_dedicated(
    fig7_resnet50: dict[str, dict[str, float]],
) -> None:
    """Orion §6.2.1: "Orion keeps p99 latency of the high-priority inference job within 14% of the ideal latency
    ... on average" (the abstract: "within 14% on average"), applied to the ResNet50 bar."""
    assert fig7_resnet50["mean"]["orion"] <= 1.14, fig7_resnet50


@pytest.mark.xfail(
    strict=True,
    reason="paper: Orion has the lowest HP p99 of every baseline in inf-train (Orion §6.2.1, Fig. 7, each bar "
    "averaged over the five BE training jobs). Same experiment for the ResNet50 bar (2 seeds x 400 requests): "
    "Orion 1.155x ties REEF-N 1.151x (1.163x vs 1.177x with 3 seeds x 1,000 requests) and beats MPS 1.33x, "
    "Streams 1.27x and temporal 10.8x; beside BERT training Orion (1.24x) is worse than MPS (1.22x), Streams "
    "(1.18x) and REEF-N (1.18x). Over all five HP models (tests/bench/bench_orion_inf_train.py) REEF-N averages "
    "1.090x and Orion 1.098x. " + _MODEL_GAPS,
)
def test_orion_beats_every_baseline_on_hp_p99(fig7_resnet50: dict[str, dict[str, float]]) -> None:
    mean = fig7_resnet50["mean"]
    assert all(mean["orion"] < mean[p] for p in ("temporal", "mps", "streams", "reef")), mean


def test_orion_beats_mps_streams_and_temporal_on_hp_p99(fig7_resnet50: dict[str, dict[str, float]]) -> None:
    """What reproduces of Fig. 7's order on the ResNet50 bar: Orion below MPS, Streams and temporal sharing."""
    mean = fig7_resnet50["mean"]
    assert all(mean["orion"] < mean[p] for p in ("temporal", "mps", "streams")), mean


@pytest.mark.xfail(
    strict=True,
    reason="paper: Orion's HP p99 is 2.3-3x lower than REEF's on average in inf-train (Orion §6.2.1; REEF at 2.5x "
    "ideal with Poisson arrivals, 3.44x with Apollo). Same experiment for the ResNet50 bar (2 seeds x 400 "
    "requests): REEF-N 1.151x, Orion 1.155x, a ratio of 1.00; over all five HP models 1.090x / 1.098x = 0.99 "
    "(tests/bench/bench_orion_inf_train.py). In the model REEF-N's BE backlog costs the HP little: HP kernels "
    "bypass queued BE kernels and take SMs at wave boundaries. " + _MODEL_GAPS,
)
def test_orion_hp_p99_2_3x_lower_than_reef(fig7_resnet50: dict[str, dict[str, float]]) -> None:
    """Orion §6.2.1: Orion's p99 "is 2.3-3x lower than REEF, on average"."""
    mean = fig7_resnet50["mean"]
    assert mean["reef"] >= 2.3 * mean["orion"], mean


@pytest.mark.xfail(
    strict=True,
    reason="paper: REEF gives the HP 2.5x its dedicated p99 in inf-train with Poisson arrivals (3.44x with the "
    "Apollo trace; Orion §6.2.1, Figs. 6-7, averaged over the five BE training jobs). Same experiment for the "
    "ResNet50 bar (2 seeds x 400 requests): REEF-N 1.15x (1.18x with 3 seeds x 1,000 requests), per job "
    "1.06-1.21x; over all five HP models 1.09x. In the model HP kernels bypass queued BE kernels and take SMs at "
    "wave boundaries, so the BE backlog REEF-N lets through while the HP is idle costs little. "
    + _MODEL_GAPS,
)
def test_reef_hp_p99_2_5x_dedicated_inf_train(fig7_resnet50: dict[str, dict[str, float]]) -> None:
    """Orion §6.2.1: with Poisson arrivals REEF's inference p99 is 2.5x the ideal (3.44x with Apollo)."""
    assert fig7_resnet50["mean"]["reef"] >= 2.5, fig7_resnet50["mean"]


def test_temporal_sharing_head_of_line_blocking(inf_train: ExperimentResult) -> None:
    assert inf_train.results["temporal"].ratio_p99 > 3


INF_INF_BE = ("mobilenetv2", "resnet101", "bert", "transformer")


@pytest.fixture(scope="module")
def inf_inf() -> dict[str, ExperimentResult]:
    """Orion §6.2.3 Fig. 12 (Poisson), the ResNet50 bar: ResNet50 inference at 50 req/s beside each other Table 3
    model as BE inference at its own inf-inf Poisson rate (seed 0, 200 measured requests, as
    ``tests/bench/bench_orion_inf_inf.py --hp resnet50`` runs it)."""
    return {
        be: run_experiment(
            Collocation(
                hp_model="resnet50",
                be_models=(be,),
                be_role="inference",
                rate_rps=INF_INF_RPS["resnet50"]["poisson"],
                requests=200,
                warmup_requests=10,
            ),
            ("dedicated", "mps", "orion"),
        )
        for be in INF_INF_BE
    }


@pytest.mark.xfail(
    strict=True,
    reason="paper: Streams/MPS give the HP 1.89x its dedicated p99 on average in inf-inf (Orion §6.2.3, Fig. 12 "
    "Poisson; 2.2x with 4 BE clients on an A100, §6.3). Same setting here (HP and BE inference, Poisson at Table "
    "3's inf-inf rates, two clients): MPS 1.28x for a ResNet50 HP averaged over its 4 BE models, 1.22x over all "
    "5 HP models (tests/bench/bench_orion_inf_inf.py). At these rates a BE inference client keeps the GPU busy "
    "26-32 % of the time (bench_orion_inf_inf.py --mix-stats), so most HP requests meet no BE kernel; only BERT's "
    "long, full-GPU kernels inflate the HP p99 (1.9x). One seed. " + _MODEL_GAPS,
)
def test_mps_hp_p99_inf_inf_about_1_89x_dedicated(inf_inf: dict[str, ExperimentResult]) -> None:
    mean = sum(r.results["mps"].ratio_p99 for r in inf_inf.values()) / len(inf_inf)
    assert mean >= 1.8, mean


@pytest.mark.xfail(
    strict=True,
    reason="paper: Orion keeps the HP inference p99 within 15 % of ideal in inf-inf with Poisson arrivals (Orion "
    "§6.2.3, Fig. 12; each bar averages the HP's collocations with the other four models as BE inference at Table "
    "3's inf-inf rates). Same experiment for the ResNet50 bar (seed 0, 200 measured requests per pair): Orion 1.25x "
    "(MPS 1.28x); over all five HP models the mean is 1.16x (tests/bench/bench_orion_inf_inf.py). The gap is the "
    "BERT column: beside BERT inference (60 ms requests of long kernels needing nearly every SM) Orion gives 1.83x, "
    "about MPS's 1.91x, while beside the other models both stay within 1.15x (the next test). Whether real BERT "
    "kernels are shorter or narrower than the synthetic mix cannot be checked without a trace. One seed. "
    + _MODEL_GAPS,
)
def test_orion_hp_p99_within_15_percent_inf_inf(inf_inf: dict[str, ExperimentResult]) -> None:
    """Orion §6.2.3: Orion keeps the HP inference p99 within 15 % of ideal in inf-inf with Poisson arrivals
    (Fig. 12; the bar of an HP model averages its collocations with the other four models)."""
    mean = sum(r.results["orion"].ratio_p99 for r in inf_inf.values()) / len(inf_inf)
    assert mean <= 1.15, mean


def test_inf_inf_why_orion_misses_its_bound_bert_be_kernels(inf_inf: dict[str, ExperimentResult]) -> None:
    """Not a finding of the paper: the model's reason for the xfail above. A BERT BE kernel admitted while the
    HP is idle holds nearly every SM until it ends (no preemption, Orion §5.1.2), so an HP request arriving then
    waits for it under Orion as under MPS. Beside the vision models the HP p99 stays within 15 % of dedicated
    under both (the BE keeps the GPU busy only part of the time)."""
    bert = inf_inf["bert"].results
    assert bert["mps"].ratio_p99 > 1.5 and bert["orion"].ratio_p99 > 0.9 * bert["mps"].ratio_p99
    for be in ("mobilenetv2", "resnet101"):
        assert inf_inf[be].results["mps"].ratio_p99 < 1.15, be


def test_reef_starves_be_in_train_train(train_train: ExperimentResult) -> None:
    r = train_train.results
    assert r["reef"].be_ratio < 0.25 < r["mps"].be_ratio
    assert r["reef"].ratio_p99 <= 1.1


def test_be_throughput_and_cost_saving_reported(inf_train: ExperimentResult) -> None:
    for p in ("mps", "orion", "tessera"):
        r = inf_train.results[p]
        assert r.be_throughput[0] > 0
        assert r.cost_saving == pytest.approx(cost_saving(r.be_throughput[0], inf_train.be_dedicated[0]))
    assert inf_train.results["orion"].cost_saving > 1.2  # paper 1.26-1.49


def test_tessera_node_policy_keeps_hp_near_dedicated(inf_train: ExperimentResult) -> None:
    r = inf_train.results
    assert r["tessera"].ratio_p99 <= 1.25
    assert r["tessera"].ratio_p99 < r["mps"].ratio_p99
    assert r["tessera"].be_ratio < r["orion"].be_ratio  # a static cap costs BE throughput Orion keeps


def test_ablation_priorities_help(inf_train: ExperimentResult) -> None:
    r = inf_train.results
    assert r["priorities"].hp_p95 < r["mps"].hp_p95


def test_ablation_order_priorities_profiles_sm_size(inf_train: ExperimentResult) -> None:
    """§6.4: streams (default priority) > + priorities > + profiles > + SM size, on p95."""
    r = inf_train.results
    assert r["mps"].hp_p95 > r["priorities"].hp_p95 > r["orion-profiles"].hp_p95 > r["orion"].hp_p95


def test_sm_size_awareness_helps(inf_train: ExperimentResult) -> None:
    r = inf_train.results
    assert r["orion"].hp_p95 < r["orion-profiles"].hp_p95
    assert ABLATION[-1] == "orion"


def test_scenario_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from tessera.commands.simulate import main

    f = tmp_path / "o.yaml"
    f.write_text(
        "kind: orion\nworkload: {requests: 20, warmup_requests: 2}\npolicies: [dedicated, mps, orion]\n"
    )
    ns = argparse.Namespace(
        scenario=str(f), json=False, plots=None, seed=None, no_progress=True, metrics_out=None
    )
    assert main(ns) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "orion" in out and "p99/ideal" in out


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("workload: {hp_model: vgg}", "workload.hp_model"),
        ("workload: {be_models: [nope]}", "workload.be_models[0]"),
        ("policies: [magic]", "policies[0]"),
        ("workload: {rate_rps: -1}", "workload.rate_rps"),
        ("policy: {be_percent: 0}", "policy.be_percent"),
    ],
)
def test_scenario_errors_name_the_field(tmp_path: Path, body: str, field: str) -> None:
    from tessera.commands.simulate import load_scenario
    from tessera.sim.scenario import ScenarioError

    f = tmp_path / "o.yaml"
    f.write_text("kind: orion\n" + body + "\n")
    with pytest.raises(ScenarioError) as e:
        load_scenario(f)
    assert e.value.field == field
