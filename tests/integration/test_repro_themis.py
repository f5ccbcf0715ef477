"""Reproduction of the Themis paper's findings on small seeded traces (spec seed-themis §4.6, §6.7).

Fast sizes: the 64-GPU testbed shape, 40 apps of the W2-style workload. Each test asserts an ordering
or ratio band the paper reports; docs/results-themis.md puts our figures next to the paper's.
"""

from __future__ import annotations

import functools
import random

import pytest
from tessera.cluster import Cluster
from tessera.policy.baselines import BASELINES
from tessera.policy.themis import Themis, ThemisConfig
from tessera.sim.training.report import PolicySummary
from tessera.sim.training.scenario import PRESETS
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import GeneratorConfig, Trace, generate

pytestmark = pytest.mark.slow
CLUSTER = Cluster.build(PRESETS["testbed-64"])
SEED = 3


@functools.cache
def _trace(ni: float | None) -> Trace:
    return generate(
        GeneratorConfig(apps=40, mean_interarrival_s=1200, network_intensive_share=ni),
        random.Random(SEED),
        64,
    )


@functools.cache
def _run(name: str, ni: float | None = None, f: float = 0.8, lease: float = 600.0) -> PolicySummary:
    policy = (
        Themis(ThemisConfig(fairness_knob=f, lease_s=lease))
        if name == "themis"
        else BASELINES[name](lease_s=lease)
        if name != "drf"
        else BASELINES[name]()
    )
    return PolicySummary.of(simulate(policy, CLUSTER, _trace(ni), random.Random(SEED), SimConfig()))


def test_themis_has_the_lowest_max_rho() -> None:
    themis = _run("themis")
    for name in BASELINES:
        assert themis.max_rho <= _run(name).max_rho, f"{name} has a lower max ρ than Themis"


@pytest.mark.xfail(
    strict=True, reason="gap: no 1.2× margin at 100 % network-intensive yet (docs/results-themis.md)"
)
def test_all_network_intensive_themis_beats_the_best_baseline_by_1_2x() -> None:
    themis = _run("themis", 1.0)
    best = min(_run(n, 1.0).max_rho for n in BASELINES)
    assert best / themis.max_rho >= 1.2  # paper: 1.24–1.77×


def test_gpu_hours_within_5_percent_of_gandiva() -> None:
    assert _run("themis").gpu_hours <= 1.05 * _run("gandiva").gpu_hours


def test_fairness_knob_sweep() -> None:
    rho = {f: _run("themis", f=f).max_rho for f in (0.0, 0.8, 1.0)}
    assert rho[0.8] <= rho[0.0], "max ρ should improve as f goes 0 → 0.8"
    assert rho[1.0] > rho[0.8], "and worsen at f = 1"


@pytest.mark.xfail(
    strict=True, reason="gap: restart cost outweighs queueing at this size (docs/results-themis.md)"
)
def test_shorter_leases_give_better_fairness() -> None:
    assert _run("themis", lease=300.0).max_rho <= _run("themis", lease=1800.0).max_rho
