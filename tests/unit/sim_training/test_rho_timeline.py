"""SimRun.rho_timeline: (t, app, ρ_current, GPUs held) for every active app at every round."""

from __future__ import annotations

import random

from tessera.cluster import Cluster
from tessera.policy.baselines import BASELINES
from tessera.policy.themis import Themis, ThemisConfig
from tessera.sim.training.scenario import PRESETS
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import GeneratorConfig, generate


def _run(policy_name: str) -> tuple[list[tuple[float, str, float, int]], int, dict[str, tuple[float, float]]]:
    cluster = Cluster.build(PRESETS["testbed-64"])
    trace = generate(GeneratorConfig(apps=4, mean_interarrival_s=14400), random.Random(7), 64)
    policy = Themis(ThemisConfig()) if policy_name == "themis" else BASELINES[policy_name]()
    run = simulate(policy, cluster, trace, random.Random(7), SimConfig())
    life = {o.app_id: (o.arrival, o.finish) for o in run.apps}
    return run.rho_timeline, run.rounds, life


def test_every_round_samples_every_active_app() -> None:
    timeline, rounds, life = _run("themis")
    instants = sorted({t for t, *_ in timeline})
    assert len(instants) == rounds
    for t in instants:
        sampled = {a for tt, a, _, _ in timeline if tt == t}
        active = {a for a, (arr, fin) in life.items() if arr <= t < fin}
        assert sampled == active


def test_rho_and_gpus_are_consistent() -> None:
    for name in ("themis", "gandiva"):
        timeline, _, _ = _run(name)
        assert timeline
        for _, _, rho, gpus in timeline:
            assert 0 <= gpus <= 64
            # Holding nothing: ρ is the cap (the app would never finish); holding GPUs: a finite ρ > 0.
            assert rho == 1e6 if gpus == 0 else 0 < rho < 1e6
        assert any(g > 0 for *_, g in timeline)
