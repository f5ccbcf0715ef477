"""Reproduction of the Themis paper's findings on small seeded traces (spec seed-themis §4.6, §6.7).

Fast sizes: the 64-GPU testbed shape, 12 apps of the W2-style workload drawn from the paper's statistics
(median task 3.75 GPU-h, median 75 configs per app, 42.5 s restart per GPU change). Each test asserts an
ordering or ratio band the paper reports; findings that do not reproduce are strict xfails carrying the
measured figure. docs/results-themis.md puts our figures next to the paper's.
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
APPS = 12


@functools.cache
def _trace(ni: float | None) -> Trace:
    return generate(
        GeneratorConfig(apps=APPS, mean_interarrival_s=14400, network_intensive_share=ni),
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
    s = PolicySummary.of(simulate(policy, CLUSTER, _trace(ni), random.Random(SEED), SimConfig()))
    print(f"{name} ni={ni} f={f} lease={lease}: max rho {s.max_rho:.2f} GPU-h {s.gpu_hours:.0f}")
    return s


@pytest.mark.xfail(
    strict=True,
    reason="gap: measured Themis 2.83 vs SRSF 1.71, Tiresias 2.14 (12 apps, seed 3); with free restarts "
    "still 1.98 vs 1.43: a halving app loses GPUs at phase barriers and wins few back while a rival whose "
    "whole lease just expired ranks at ρ_cap; see docs/results-themis.md, 'Where the gap comes from'",
)
def test_themis_has_the_lowest_max_rho() -> None:
    themis = _run("themis")
    for name in BASELINES:
        assert themis.max_rho <= _run(name).max_rho, f"{name} has a lower max ρ than Themis"


@pytest.mark.xfail(
    strict=True,
    reason="gap: measured best baseline 1.71 / Themis 2.83 = 0.60× at 100 % network-intensive "
    "(paper 1.24–1.77×); see docs/results-themis.md",
)
def test_all_network_intensive_themis_beats_the_best_baseline_by_1_2x() -> None:
    themis = _run("themis", 1.0)
    best = min(_run(n, 1.0).max_rho for n in BASELINES)
    assert best / themis.max_rho >= 1.2  # paper: 1.24–1.77×


def test_gpu_hours_within_5_percent_of_gandiva() -> None:
    assert _run("themis").gpu_hours <= 1.05 * _run("gandiva").gpu_hours


@pytest.mark.xfail(
    strict=True,
    reason="gap: measured max ρ 2.83 at both f = 0.8 and f = 1 (paper: ~1.5× worse at 1); "
    "one long app sets max ρ under every f (docs/results-themis.md)",
)
def test_fairness_knob_sweep() -> None:
    rho = {f: _run("themis", f=f).max_rho for f in (0.0, 0.8, 1.0)}
    assert rho[0.8] <= rho[0.0], "max ρ should improve as f goes 0 → 0.8"
    assert rho[1.0] > rho[0.8], "and worsen at f = 1"


def test_shorter_leases_give_better_fairness() -> None:
    # With hour-long tasks the 42.5 s restart no longer outweighs queueing: 2.70 at 300 s vs 2.92 at 1800 s.
    assert _run("themis", lease=300.0).max_rho <= _run("themis", lease=1800.0).max_rho
