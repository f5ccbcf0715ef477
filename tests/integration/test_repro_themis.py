"""Reproduction of the Themis paper's findings on small seeded traces (Themis §6).

Fast sizes with the paper's contention: 80 W2-style apps (the default scenario's evaluation-sized apps:
4–32 configurations, median task 6 GPU-minutes, 42.5 s restart per GPU change) arriving every 40 minutes
on a 16-GPU cluster (2 × 2-GPU + 3 × 4-GPU machines), so 10–30 apps compete at a time; seeds 1–3 (the
f = 1 finding runs on the paper's 168-GPU simulator cluster, where placement choices exist). Each
test asserts an ordering or ratio band the paper reports; a finding that does not reproduce is a strict
xfail carrying the measured figures. docs/results-themis.md puts our figures next to the paper's.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any, cast

import pytest
from tessera.cluster import NETWORK_INTENSIVE, Cluster, Sensitivity
from tessera.policy.baselines import BASELINES
from tessera.policy.themis import Themis, ThemisConfig
from tessera.sim.training.report import PolicySummary
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import GeneratorConfig, Trace, TraceApp, TraceJob, generate

pytestmark = pytest.mark.slow
CLUSTER = Cluster.build([(1, 2)] * 2 + [(1, 4)] * 3)
SEEDS = (1, 2, 3)


def _apps(apps: int, interarrival_s: float, ni: float | None = None) -> GeneratorConfig:
    """The default scenario's evaluation-sized W2 apps (4–32 configurations, 6-GPU-minute median task)."""
    return GeneratorConfig(
        apps=apps,
        mean_interarrival_s=interarrival_s,
        task_gpu_hours_median=0.1,
        min_trial_s=120,
        jobs_per_app=(4, 32),
        jobs_per_app_median=16,
        network_intensive_share=ni,
    )


@functools.cache
def _trace(seed: int, ni: float | None) -> Trace:
    return generate(_apps(80, 2400, ni), random.Random(seed), len(CLUSTER))


# Each simulation is independent and CPU-bound: a test first runs those it needs that are not cached yet in
# parallel processes (`_prefetch`), one per core, then reads them from the cache. Results are the same as
# run one after another (every run is seeded); on CI's two cores the module takes about half as long.
_CACHE: dict[tuple[Any, ...], Any] = {}


def _simulate(key: tuple[Any, ...]) -> Any:
    """One simulation by its cache key: ("app", name, seed, ni, f, lease, error, error_seed),
    ("paper", seed, f) or ("liar", x)."""
    kind, *args = key
    if kind == "app":
        return _app_run(*args)
    if kind == "paper":
        return _paper_run(*args)
    return _liar_run(*args)


def _cached(key: tuple[Any, ...]) -> Any:
    if key not in _CACHE:
        _CACHE[key] = _simulate(key)
    return _CACHE[key]


def _prefetch(keys: list[tuple[Any, ...]]) -> None:
    missing = list(dict.fromkeys(k for k in keys if k not in _CACHE))
    workers = min(os.cpu_count() or 1, len(missing))
    if workers <= 1:
        return
    # spawn, not fork: the test process may hold threads (a control plane's fixtures) that fork would copy
    # mid-lock.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for key, result in zip(missing, pool.map(_simulate, missing), strict=True):
            _CACHE[key] = result


def _key(
    name: str,
    seed: int = 1,
    ni: float | None = None,
    f: float = 0.8,
    lease: float = 600.0,
    error: float = 0.0,
    error_seed: int = 0,
) -> tuple[Any, ...]:
    return ("app", name, seed, ni, f, lease, error, error_seed)


def _run(*args: Any, **kwargs: Any) -> PolicySummary:
    return cast(PolicySummary, _cached(_key(*args, **kwargs)))


def _app_run(
    name: str, seed: int, ni: float | None, f: float, lease: float, error: float, error_seed: int
) -> PolicySummary:
    if name == "themis":
        policy = Themis(ThemisConfig(fairness_knob=f, lease_s=lease))
    else:
        policy = BASELINES[name]() if name == "drf" else BASELINES[name](lease_s=lease)
    sim = SimConfig(estimate_error=error, estimate_error_seed=error_seed)
    run = simulate(policy, CLUSTER, _trace(seed, ni), random.Random(seed), sim)
    s = PolicySummary.of(run)
    print(f"{name} seed={seed} ni={ni} f={f} lease={lease}: max rho {s.max_rho:.2f} GPU-h {s.gpu_hours:.0f}")
    return s


@pytest.mark.parametrize("seed", SEEDS)
def test_themis_has_the_lowest_max_rho(seed: int) -> None:
    # Measured: Themis 1.73 / 1.36 / 1.70, best baseline 2.38 (Tiresias) / 2.39 (SRTF) / 2.71 (SRSF).
    _prefetch([_key("themis", seed), *(_key(name, seed) for name in BASELINES)])
    themis = _run("themis", seed)
    for name in BASELINES:
        assert themis.max_rho < _run(name, seed).max_rho, f"{name} has a lower max ρ than Themis"


def test_all_network_intensive_themis_beats_the_best_baseline_by_1_2x() -> None:
    # Measured: best baseline SRSF 2.69 / Themis 1.83 = 1.47× (paper: 1.24–1.77×).
    _prefetch([_key("themis", ni=1.0), *(_key(n, ni=1.0) for n in BASELINES)])
    themis = _run("themis", ni=1.0)
    best = min(_run(n, ni=1.0).max_rho for n in BASELINES)
    assert best / themis.max_rho >= 1.2


@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_hours_within_5_percent_of_gandiva(seed: int) -> None:
    # Measured: −1.6 %, +0.9 %, +1.4 % (paper, testbed W2: 4.8 % below Gandiva).
    _prefetch([_key("themis", seed), _key("gandiva", seed)])
    assert _run("themis", seed).gpu_hours <= 1.05 * _run("gandiva", seed).gpu_hours


@pytest.mark.parametrize("seed", SEEDS)
def test_max_rho_improves_as_f_goes_from_0_to_0_8(seed: int) -> None:
    # Measured: 2.25 → 1.73, 6.96 → 1.36, 6.12 → 1.70; GPU time rises with f (Fig. 19b).
    _prefetch([_key("themis", seed, f=0.8), _key("themis", seed, f=0.0)])
    assert _run("themis", seed, f=0.8).max_rho < _run("themis", seed, f=0.0).max_rho
    assert _run("themis", seed, f=0.8).gpu_hours >= _run("themis", seed, f=0.0).gpu_hours


# Fig. 19 is a simulator experiment, and the paper's simulator cluster has far more placement choices than
# CLUSTER: 16 × 8-GPU machines (4 slots × 2 GPUs), 6 × 4-GPU machines (4 slots × 1 GPU) and 16 single-GPU
# machines, 168 GPUs (Themis §6.1). On CLUSTER (2- and 4-GPU machines) f = 1 and f = 0.8 tie (1.72 vs 1.73,
# 1.36 vs 1.36, 1.70 vs 1.70): a lone bidder has few poor placements to be forced into.
PAPER_CLUSTER = Cluster.themis_paper("168")


def _paper_cluster_run(seed: int, f: float) -> PolicySummary:
    return cast(PolicySummary, _cached(("paper", seed, f)))


def _paper_run(seed: int, f: float) -> PolicySummary:
    trace = generate(_apps(100, 100), random.Random(seed), len(PAPER_CLUSTER))
    policy = Themis(ThemisConfig(fairness_knob=f))
    s = PolicySummary.of(simulate(policy, PAPER_CLUSTER, trace, random.Random(seed), SimConfig()))
    print(
        f"168 GPUs seed={seed} f={f}: max ρ {s.max_rho:.3f} GPU-h {s.gpu_hours:.0f} placement {s.placement_mean:.3f}"
    )
    return s


def test_max_rho_worsens_at_f_1_through_poorer_placements() -> None:
    # Measured on the paper's 168-GPU simulator cluster, 100 apps every 100 s, seeds 1–3: max ρ 0.594 →
    # 0.707, 0.622 → 0.721, 0.746 → 0.823 from f = 0.8 to 1 (mean 1.15×; paper ~1.5×), with the paper's
    # cause: a single bidder takes the GPUs offered next to whatever it holds, so placement scores fall
    # (0.898 → 0.857 …) and GPU-hours rise (+11 %).
    _prefetch([("paper", s, f) for s in SEEDS for f in (0.8, 1.0)])
    ratios = []
    for s in SEEDS:
        f08, f1 = _paper_cluster_run(s, 0.8), _paper_cluster_run(s, 1.0)
        assert f1.max_rho > f08.max_rho, f"seed {s}"
        assert f1.placement_mean < f08.placement_mean and f1.gpu_hours > f08.gpu_hours, f"seed {s}"
        ratios.append(f1.max_rho / f08.max_rho)
    assert statistics.mean(ratios) > 1.1, ratios


def test_shorter_leases_give_better_fairness_and_longer_ones_better_efficiency() -> None:
    # Mean over seeds 1–3, measured: max ρ 1.58 at 300 s vs 1.66 at 1,800 s (seed 3 alone: 1.75 vs 1.70);
    # GPU-hours fall as leases lengthen on every seed (fewer checkpoints, Fig. 19b).
    _prefetch([_key("themis", s, lease=lease) for s in SEEDS for lease in (300.0, 1800.0)])
    short = statistics.mean(_run("themis", s, lease=300.0).max_rho for s in SEEDS)
    long = statistics.mean(_run("themis", s, lease=1800.0).max_rho for s in SEEDS)
    assert short < long
    for s in SEEDS:
        assert _run("themis", s, lease=1800.0).gpu_hours < _run("themis", s, lease=300.0).gpu_hours


def test_estimation_error_of_20_percent_changes_max_rho_little() -> None:
    # Fig. 17: per-app errors uniform in [−20 %, 20 %] on iteration counts and S change max ρ by 10.76 %.
    # Measured over seeds 1–3 × three error draws: mean |change| 4.9 %, largest 12.3 %.
    _prefetch(
        [_key("themis", s) for s in SEEDS]
        + [_key("themis", s, error=0.2, error_seed=e) for s in SEEDS for e in range(3)]
    )
    changes = [
        abs(_run("themis", s, error=0.2, error_seed=e).max_rho / _run("themis", s).max_rho - 1)
        for s in SEEDS
        for e in range(3)
    ]
    print(f"max ρ change at X = 20 %: mean {statistics.mean(changes):.3f}, largest {max(changes):.3f}")
    assert statistics.mean(changes) <= 0.15
    assert max(changes) <= 0.25


# Fig. 18 (Themis §6.3): 64 GPUs as one 8-GPU machine and 28 2-GPU machines; 8 identical network-intensive
# apps, each four 8-GPU jobs (4× contention); app-0 over-reports the slowdown of spread placements by X.
LIAR_CLUSTER = Cluster.build([(1, 8)] + [(1, 2)] * 28)
LIAR_TRACE = Trace(
    [TraceApp(f"app-{i}", 0.0, tuple(TraceJob(9000.0, 8.0, 8) for _ in range(4))) for i in range(8)]
)


def _liar_jct_h(x: float) -> float:
    _prefetch([("liar", v) for v in (0.0, 0.2, 0.34, 0.5, 1.0)])
    return cast(float, _cached(("liar", x)))


def _liar_run(x: float) -> float:
    ni = NETWORK_INTENSIVE
    lie = Sensitivity(ni.slot, ni.machine, ni.cross_machine * (1 + x), ni.cross_rack * (1 + x))
    sim = SimConfig(reported_sensitivity=(("app-0", lie),))
    run = simulate(Themis(), LIAR_CLUSTER, LIAR_TRACE, random.Random(1), sim)
    liar = next(o for o in run.apps if o.app_id == "app-0")
    print(f"liar X={x}: JCT {(liar.finish - liar.arrival) / 3600:.2f} h")
    return (liar.finish - liar.arrival) / 3600


@pytest.mark.parametrize("x", [0.2, 0.34, 0.5, 1.0])
def test_lying_about_placement_does_not_pay(x: float) -> None:
    # Measured: 13.87 h truthful; 13.95 / 13.88 / 13.93 / 13.91 h lying (Themis §6.3: no gain beyond noise).
    assert _liar_jct_h(x) >= 0.99 * _liar_jct_h(0.0)


@pytest.mark.xfail(
    strict=True,
    reason="paper: Themis Fig. 18 (§6.3, simulator): 64 GPUs (one 8-GPU machine, the rest 2-GPU), 8 identical apps, one "
    "over-reporting its slowdown on spread placements by X; past X ≈ 34 % its hidden payment jumps and it is "
    "clearly slower. Same cluster, app count and lie here; the paper gives no job sizes, arrivals, fairness "
    "knob or lease, ours: four 8-GPU 9,000-s jobs per app, all at t = 0, f = 0.8. Measured: no tipping point, "
    "13.87 h truthful vs 13.91 h at X = 100 %. At f = 0.8 the two bidders ask for 32 GPUs each and every lease "
    "expires at once, so the 64-GPU offer can satisfy both, leaving little for a hidden payment to take; with "
    "f = 0 the liar's JCT rises only 2 % at X = 100 % (12.93 → 13.19 h); docs/results-themis.md",
)
def test_lying_past_the_tipping_point_costs_the_liar() -> None:
    assert _liar_jct_h(1.0) > 1.1 * _liar_jct_h(0.0)
