"""The simulator's speed-ups (cached pool layout, equal-job phase times, per-instant estimate memo) must
not change any decision: same seed → the same summary numbers as the code before them.

The expected figures were recorded with the pre-optimisation code (commit d5c4eaa) on this seeded trace.
"""

from __future__ import annotations

import random

import pytest
from tessera.cluster import Cluster
from tessera.policy.baselines import BASELINES
from tessera.policy.themis import Themis, ThemisConfig
from tessera.policy.themis.estimate import equal_phase_time, phase_time
from tessera.sim.training.report import PolicySummary
from tessera.sim.training.scenario import PRESETS
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import GeneratorConfig, generate

# The arbiter rules of that commit (filter over apps with unmet demand, unclaimed GPUs as random leftover,
# apps holding nothing ranked first by arrival, an App back at lease end placed as a newcomer).
OLD_RULES = ThemisConfig(
    filter_over="hungry", unclaimed="leftover", starving_rank="cap", renew_in_place=False
)
# policy: (max ρ, GPU-hours, makespan h, avg JCT h, rounds, events), 8 apps, seed 5, testbed-64
RECORDED = {
    "themis": (1.6106890425113534, 2653.45962687839, 46.58694861656342, 9.307164399288206, 1324, 3835),
    "tiresias": (1.9852886493243522, 3136.488317329168, 53.9920020512543, 12.880566295636683, 1392, 4641),
    "gandiva": (2.596127664805733, 2679.0359452966795, 47.01222776542834, 10.778016448549279, 1327, 3929),
    "optimus": (1.6106890425113534, 2645.561592516666, 46.48923350930139, 9.180801455287282, 1451, 4808),
    "slaq": (2.63604452277895, 2899.135185905902, 50.24935834886089, 14.469225611869929, 1674, 5822),
    "srtf": (1.6106890425113534, 2677.0480126243597, 47.03815186981895, 7.712723884775805, 737, 2657),
    "srsf": (1.6333146246346388, 2676.466754376753, 46.92797726815813, 7.740525254996214, 714, 2597),
    "drf": (1.7278699701461773, 2636.738323950641, 46.21841804206123, 9.288288043367782, 58, 1189),
}


@pytest.mark.parametrize("name", list(RECORDED))
def test_same_seed_same_summary_as_before_the_speedups(name: str) -> None:
    cluster = Cluster.build(PRESETS["testbed-64"])
    trace = generate(GeneratorConfig(apps=8, mean_interarrival_s=14400), random.Random(5), 64)
    policy = Themis(OLD_RULES) if name == "themis" else BASELINES[name]()
    run = simulate(policy, cluster, trace, random.Random(5), SimConfig())
    s = PolicySummary.of(run)
    max_rho, gpu_h, makespan, jct, rounds, events = RECORDED[name]
    assert (run.rounds, run.events) == (rounds, events)
    assert s.max_rho == pytest.approx(max_rho, rel=1e-12)
    assert s.gpu_hours == pytest.approx(gpu_h, rel=1e-12)
    assert s.makespan_h == pytest.approx(makespan, rel=1e-12)
    assert s.avg_jct_h == pytest.approx(jct, rel=1e-12)


@pytest.mark.parametrize("n", [1, 3, 8, 64, 75])
@pytest.mark.parametrize("gpus", [0, 1, 2, 5, 7, 8, 16, 64, 200])
def test_equal_phase_time_is_bit_identical_to_phase_time(n: int, gpus: int) -> None:
    for t, iters, slow, cap in [(0.37, 1234.5, 1.1, 8), (3.0, 7.0, 1.0, 2), (1e-3, 1e6, 1.3, 16)]:
        assert equal_phase_time(t, n, iters, gpus, cap, slow) == phase_time([t] * n, iters, gpus, cap, slow)
