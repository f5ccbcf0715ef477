"""Two-level scheduling: Themis leases GPUs across Apps; Fluid places a tuning App's trials in its lease.

The training simulator builds each App's runtime with `make_runtime`; here the tuning App's runtime is
the Fluid one and every other App keeps the simulator's own runtime, so Themis' real auctions decide
the tuning App's lease.
"""

import random
from dataclasses import replace

import pytest
from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig
from tessera.policy.hpo import hyperband
from tessera.policy.themis import Themis, ThemisConfig
from tessera.sim.training import simulator
from tessera.sim.training.trace import AppSpec, JobSpec, Trace
from tessera.sim.tuning.engine import Placed, TuningSim
from tessera.sim.tuning.experiments import make_algorithm
from tessera.sim.tuning.two_level import FluidAppRuntime, Lease
from tessera.sim.tuning.workload import Workload

WORKLOAD = Workload(seed=1, iter_time=20.0)


def lease_of(leases: list[Lease], index: int) -> frozenset[str]:
    """The GPU set in force when placement number `index` was made."""
    current = frozenset[str]()
    for lease in leases:
        if lease.first_placement <= index:
            current = lease.gpus
    return current


def run_cluster(monkeypatch: pytest.MonkeyPatch) -> tuple[simulator.SimRun, FluidAppRuntime]:
    cluster = Cluster.homogeneous(4, 4)
    apps = [
        AppSpec("train-a", 0.0, (JobSpec(3000, 1.0, 4),)),
        AppSpec("train-b", 0.0, (JobSpec(1500, 1.0, 2), JobSpec(1500, 1.0, 2))),
        AppSpec("train-c", 900.0, (JobSpec(4000, 1.0, 8),)),
        AppSpec("tune", 0.0, (JobSpec(1, 1.0, 1),)),  # jobs unused: the Fluid runtime replaces them
    ]
    made: dict[str, FluidAppRuntime] = {}
    original = simulator.make_runtime

    def make(spec: AppSpec, c: Cluster, cfg: simulator.SimConfig) -> simulator.AppRuntime:
        if spec.id != "tune":
            return original(spec, c, cfg)
        made["tune"] = FluidAppRuntime(
            c,
            WORKLOAD,
            make_algorithm("hyperband", WORKLOAD, seed=1),
            FluidConfig(max_pack=2, max_workers=4, epsilon=5.0),
            max_gpus=8,
            start=spec.arrival,
        )
        return made["tune"]

    monkeypatch.setattr(simulator, "make_runtime", make)
    policy = Themis(ThemisConfig(lease_s=300.0))
    run = simulator.simulate(policy, cluster, Trace(apps), random.Random(0))
    return run, made["tune"]


def test_tuning_app_trials_run_inside_its_themis_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    run, rt = run_cluster(monkeypatch)
    outcomes = {a.app_id: a for a in run.apps}
    assert set(outcomes) == {"train-a", "train-b", "train-c", "tune"}
    assert not any(a.rejected for a in outcomes.values())
    assert rt.done() and rt.algorithm.finished()
    placed: list[Placed] = rt.sim.placements
    assert placed, "Fluid never placed a trial"
    for i, p in enumerate(placed):
        assert set(p.gpus) <= lease_of(rt.leases, i), f"{p} outside the lease"
    # The lease changed while trials ran (auctions, lease expiry, other Apps arriving), and Fluid packed
    # trials on shared GPUs at some point and gave some trial a multi-GPU gang at another.
    assert len({lease.gpus for lease in rt.leases}) >= 3
    packed_at = {(p.time, p.gpus[0]) for p in placed if p.packed}
    assert any(sum(1 for q in placed if q.packed and (q.time, q.gpus[0]) == k) >= 2 for k in packed_at)
    assert any(len(p.gpus) >= 2 for p in placed)
    assert rt.placement_scores and all(0 < s <= 1 for s in rt.placement_scores)
    # The App left the cluster when its last trial ended.
    assert outcomes["tune"].finish == pytest.approx(rt.sim.result().makespan)


def test_trial_group_owns_a_fixed_pool() -> None:
    cluster = Cluster.homogeneous(3, 4)
    machines = list(cluster.by_machine(cluster.gpu_ids).values())
    pool = machines[1]  # the middle machine's 4 GPUs only
    w = replace(WORKLOAD, iter_time=10.0)
    sim = TuningSim(cluster, pool, w, hyperband(w.space, 27, 1, 3, random.Random(2)), "fluid")
    result = sim.run()
    assert result.gpus == 4
    assert all(set(p.gpus) <= set(pool) for p in sim.placements)
    assert any(p.packed for p in sim.placements)
    assert sim.used_gpus() == set()
