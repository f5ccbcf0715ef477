"""The kernel-level sharing model against Orion's findings (B.9 shape; spec E.5-style directional checks).

One inf-train experiment (ResNet50 inference HP at 15 rps Poisson, ResNet50 training BE, synthetic kernel
mixes) and one inf-inf set (ResNet50 HP beside each other model as BE inference) are run once per module;
each finding is its own test. Findings the model does not show are strict
xfails that say why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tessera.policy.orion.profiles import cost_saving
from tessera.sim.orion.experiment import (
    ABLATION,
    INF_INF_RPS,
    POLICIES,
    Collocation,
    ExperimentResult,
    run_experiment,
)
from tessera.sim.orion.gpu import ClientSpec, GpuSim
from tessera.sim.orion.kernels import BN2D, CONV2D, MODELS, mix, summary
from tessera.sim.orion.schedulers import FreeForAll

W = Collocation(requests=300)


@pytest.fixture(scope="module")
def inf_train() -> ExperimentResult:
    return run_experiment(W, (*POLICIES, "priorities", "orion-profiles"))


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


def test_orion_hp_p99_within_25_percent_of_dedicated(inf_train: ExperimentResult) -> None:
    assert inf_train.results["orion"].ratio_p99 <= 1.25


def test_orion_beats_every_baseline_on_hp_p99(inf_train: ExperimentResult) -> None:
    orion = inf_train.results["orion"].hp_p99
    assert all(orion < inf_train.results[p].hp_p99 for p in ("temporal", "mps", "streams", "reef"))


def test_temporal_sharing_head_of_line_blocking(inf_train: ExperimentResult) -> None:
    assert inf_train.results["temporal"].ratio_p99 > 3


INF_INF_BE = ("mobilenetv2", "resnet101", "bert", "transformer")


@pytest.fixture(scope="module")
def inf_inf() -> dict[str, ExperimentResult]:
    """Orion §6.2.3 Fig. 12 (Poisson) for one HP model: ResNet50 inference at 50 req/s beside each other
    Table 3 model as BE inference at its own inf-inf Poisson rate [O:L264-L272]."""
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
    "Poisson, [O:L359]; 2.2x with 4 BE clients on an A100, §6.3). Same setting here (HP and BE inference, "
    "Poisson at Table 3's inf-inf rates, two clients): MPS 1.28x for a ResNet50 HP averaged over its 4 BE "
    "models, 1.22x over all 5 HP models (tests/bench/bench_orion_inf_inf.py). Remaining differences: synthetic "
    "kernel mixes from Table 1 instead of traces, one seed, a V100 model whose only interference is SM queueing "
    "and bandwidth overload (no caches, launch overhead or GIL); at these rates a BE inference client keeps "
    "the GPU busy 26-32 % of the time, so most HP requests meet no BE kernel; only BERT's long, full-GPU kernels "
    "inflate the HP p99 (1.9x)",
)
def test_mps_hp_p99_inf_inf_about_1_89x_dedicated(inf_inf: dict[str, ExperimentResult]) -> None:
    mean = sum(r.results["mps"].ratio_p99 for r in inf_inf.values()) / len(inf_inf)
    assert mean >= 1.8, mean


def test_inf_inf_orion_cannot_undo_a_long_be_kernel(inf_inf: dict[str, ExperimentResult]) -> None:
    # A BERT BE kernel admitted while the HP is idle holds nearly every SM until it ends (no preemption, Orion
    # §5.1.2): an HP request arriving then waits for it under Orion as under MPS. Beside the vision models the
    # HP p99 stays within 15 % of dedicated under both (the BE keeps the GPU busy only part of the time).
    bert = inf_inf["bert"].results
    assert bert["mps"].ratio_p99 > 1.5 and bert["orion"].ratio_p99 > 0.9 * bert["mps"].ratio_p99
    for be in ("mobilenetv2", "resnet101"):
        assert inf_inf[be].results["mps"].ratio_p99 < 1.15, be


@pytest.mark.xfail(
    strict=True,
    reason="paper: REEF gives the HP 2.5x its dedicated p99 in inf-train with Poisson arrivals and 3.44x with the "
    "Apollo trace (Orion §6.2.1, Figs. 6-7), averaged over the 5 training jobs as BE. Here (ResNet50 HP at 15 "
    "req/s Poisson, ResNet50 training BE only, synthetic kernel mixes, one seed) the model's REEF-N is only "
    "~1.1-1.3x: with HP priority at wave boundaries the BE backlog REEF lets through while HP is idle costs "
    "little, and the model has no launch queues or memcpy periods",
)
def test_reef_hp_p99_over_twice_dedicated_inf_train(inf_train: ExperimentResult) -> None:
    assert inf_train.results["reef"].ratio_p99 >= 2.0


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
