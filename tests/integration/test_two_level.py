"""Two-level scheduling: Themis leases GPUs across Apps; Fluid places a tuning App's trials in its lease.

The tuning App is an ordinary trace entry with a `tuning` block; the simulator builds its runtime with
`make_runtime` (wrapped here only to keep a handle on it), so Themis' real auctions decide its lease.
"""

import random
from dataclasses import replace

import pytest
from tessera.cluster import Cluster
from tessera.policy.hpo import hyperband
from tessera.policy.themis import Themis, ThemisConfig
from tessera.sim.training import simulator
from tessera.sim.training.trace import Trace, TraceApp, TraceJob, parse_apps
from tessera.sim.tuning.engine import Placed, TuningSim
from tessera.sim.tuning.two_level import FluidAppRuntime, LeasePeriod
from tessera.sim.tuning.workload import TuningWorkload

WORKLOAD = TuningWorkload(seed=1, iter_time=20.0)
TUNE = {
    "id": "tune",
    "arrival": 0,
    "tuning": {
        "algorithm": "hyperband",
        "seed": 1,
        "max_gpus": 8,
        "workload": {"iter_time": 20.0},
        "fluid": {"max_pack": 2, "max_workers": 4, "epsilon": 5.0},
    },
}


def lease_of(leases: list[LeasePeriod], index: int) -> frozenset[str]:
    """The GPU set in force when placement number `index` was made."""
    current = frozenset[str]()
    for lease in leases:
        if lease.first_placement <= index:
            current = lease.gpus
    return current


def run_cluster() -> tuple[simulator.SimRun, FluidAppRuntime]:
    cluster = Cluster.homogeneous(4, 4)
    apps = [
        TraceApp("train-a", 0.0, (TraceJob(3000, 1.0, 4),)),
        TraceApp("train-b", 0.0, (TraceJob(1500, 1.0, 2), TraceJob(1500, 1.0, 2))),
        TraceApp("train-c", 900.0, (TraceJob(4000, 1.0, 8),)),
        *parse_apps("test", [TUNE], len(cluster)).apps,
    ]
    made: dict[str, simulator.AppRuntime] = {}

    def keep(spec: TraceApp, c: Cluster, cfg: simulator.SimConfig) -> simulator.AppRuntime:
        made[spec.id] = simulator.make_runtime(spec, c, cfg)
        return made[spec.id]

    policy = Themis(ThemisConfig(lease_s=300.0))
    run = simulator.simulate(policy, cluster, Trace(apps), random.Random(0), runtime_factory=keep)
    rt = made["tune"]
    assert isinstance(rt, FluidAppRuntime)
    return run, rt


def test_tuning_app_trials_run_inside_its_themis_lease() -> None:
    run, rt = run_cluster()
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
    # Its outcome carries the tuning figures (time from arrival to the target, best score).
    result = rt.sim.result()
    assert outcomes["tune"].best_score == result.best_score > 0
    assert result.time_to_target is not None
    assert outcomes["tune"].time_to_target == pytest.approx(result.time_to_target - 0.0)
    assert all(a.best_score is None for k, a in outcomes.items() if k != "tune")


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
