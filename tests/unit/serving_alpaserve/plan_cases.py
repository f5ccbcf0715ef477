"""Seeded search cases whose plans were recorded with the search as it was before it was made faster.

``recorded_plans.json`` holds, for every case, the chosen placement (groups, configs, models in the
order they were added) and its score, as computed by the unoptimised search (one full simulation of the
workload per candidate). ``test_search_equivalence.py`` checks the current search returns exactly these.
Re-record only when the search's *results* are meant to change:
``.venv/bin/python -m tests.unit.serving_alpaserve.plan_cases`` (from the repository root).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tessera.policy.serving.alpaserve import (
    GB,
    ModelPlacement,
    ModelProfile,
    ParallelConfig,
    SearchOptions,
    StageProfile,
    all_configs,
    fast_greedy_selection,
    greedy_selection,
    place,
    synthetic_profile,
)
from tessera.policy.serving.alpaserve.greedy import Scored
from tessera.policy.serving.alpaserve.workload import Workload
from tessera.policy.serving.baselines.selective_replication import selective_replication
from tessera.sim.serving.placement_sim import gamma_workload, power_law_rates

RECORDED = Path(__file__).with_name("recorded_plans.json")


def bench_instance(n: int, duration: float = 30.0, seed: int = 0) -> tuple[list[ModelProfile], Workload]:
    """The benchmark's instance: n BERT-2.7B-like models, 2.5 req/s each, Gamma CV 3, SLO 5×."""
    profs = [synthetic_profile(f"m{i}", 0.238, 5.4 * GB, all_configs(8, 4)) for i in range(n)]
    names = [p.name for p in profs]
    w = gamma_workload(
        power_law_rates(names, 2.5 * n, 0.0), 3.0, duration, dict.fromkeys(names, 5 * 0.238),
        np.random.default_rng(seed),
    )  # fmt: skip
    return profs, w


def mixed_instance(
    seed: int, n_models: int = 6, duration: float = 300.0
) -> tuple[list[ModelProfile], Workload]:
    """Heterogeneous latencies and sizes (several buckets), uniform random rates, CV 3."""
    rng = np.random.default_rng(seed)
    cfgs = all_configs(4, 2)
    profs = []
    for i in range(n_models):
        lat = float(rng.choice([0.15, 0.24, 0.4]))
        size = float(rng.choice([2.4, 5.4, 10.6])) * GB
        profs.append(synthetic_profile(f"m{i}", lat, size, cfgs))
    rates = {p.name: float(r) for p, r in zip(profs, rng.uniform(0.5, 4.0, n_models), strict=True)}
    slo = {p.name: 5 * p.latency_s for p in profs}
    return profs, gamma_workload(rates, 3.0, duration, slo, rng)


def uneven_instance(seed: int) -> tuple[list[ModelProfile], Workload]:
    """Measured-looking profiles: uneven stages, non-blocking inter-stage delays, power-law rates."""
    rng = np.random.default_rng(seed)
    profs = []
    for i in range(5):
        lat = float(rng.uniform(0.1, 0.3))
        w = float(rng.uniform(2, 7)) * GB
        table = {ParallelConfig(1): StageProfile((lat,), (w,))}
        for pp in (2, 4):
            split = rng.dirichlet(np.ones(pp)) * lat * 1.05
            table[ParallelConfig(pp)] = StageProfile(
                tuple(float(x) for x in split), tuple(float(x) for x in rng.dirichlet(np.ones(pp)) * w),
                tuple(float(x) for x in rng.uniform(0, 0.01, pp - 1)),
            )  # fmt: skip
        table[ParallelConfig(1, 2)] = StageProfile((lat * 0.6,), (w / 2,))
        profs.append(ModelProfile(f"u{i}", lat, w, table))
    names = [p.name for p in profs]
    w = gamma_workload(
        power_law_rates(names, 12.0, 0.5), 4.0, 200.0, {p.name: 4 * p.latency_s for p in profs},
        np.random.default_rng(seed),
    )  # fmt: skip
    return profs, w


def _plan(s: Scored) -> dict[str, object]:
    return {
        "groups": [
            {"devices": list(g.devices), "pp": g.config.pp, "op": g.config.op, "models": list(g.models)}
            for g in s.placement.groups
        ],
        "score": s.score,
        "attainment": s.attainment,
    }


def _place(
    inst: tuple[list[ModelProfile], Workload], n: int, budget: float, opts: SearchOptions
) -> Callable[[], dict[str, object]]:
    profs, w = inst
    return lambda: {**_plan(place(profs, n, w, budget, opts).best)}


def _alg1(
    inst: tuple[list[ModelProfile], Workload], configs: list[ParallelConfig], beam: int, fast: bool
) -> Callable[[], dict[str, object]]:
    profs, w = inst
    by_name = {p.name: p for p in profs}
    names = [p.name for p in profs]

    def run() -> dict[str, object]:
        base = ModelPlacement.empty(configs)
        if fast:
            return _plan(fast_greedy_selection(names, base, by_name, w, 13 * GB))
        return _plan(greedy_selection(names, base, by_name, w, 13 * GB, beam_size=beam))

    return run


def _sr(inst: tuple[list[ModelProfile], Workload], n: int) -> Callable[[], dict[str, object]]:
    profs, w = inst
    return lambda: _plan(selective_replication(profs, n, w, 13 * GB))


SMALL = SearchOptions(max_pp=4, max_op=2, devices_per_node=4)

CASES: dict[str, Callable[[], Callable[[], dict[str, object]]]] = {
    "bench-8": lambda: _place(bench_instance(8), 8, 13 * GB, SearchOptions()),
    "bench-16": lambda: _place(bench_instance(16), 16, 13 * GB, SearchOptions()),
    "bench-16-tight-budget": lambda: _place(bench_instance(16, seed=3), 16, 6 * GB, SearchOptions()),
    "mixed-0": lambda: _place(mixed_instance(0), 8, 13 * GB, SMALL),
    "mixed-1": lambda: _place(mixed_instance(1), 8, 13 * GB, SMALL),
    "mixed-2-max-stage-overhead": lambda: _place(
        mixed_instance(2, n_models=8),
        8,
        13 * GB,
        SearchOptions(
            max_pp=4, max_op=2, devices_per_node=4, memory_rule="max_stage", fixed_overhead_s=0.011
        ),
    ),
    "mixed-5-alg1-beam1": lambda: _place(
        mixed_instance(5, n_models=4, duration=150.0),
        4,
        13 * GB,
        SearchOptions(max_pp=4, max_op=2, devices_per_node=4, fast_heuristic=False),
    ),
    "mixed-6-alg1-beam3": lambda: _place(
        mixed_instance(6, n_models=4, duration=150.0),
        4,
        13 * GB,
        SearchOptions(max_pp=4, max_op=2, devices_per_node=4, fast_heuristic=False, beam_size=3),
    ),
    "uneven-0": lambda: _place(
        uneven_instance(0), 6, 8 * GB, SearchOptions(max_pp=4, max_op=2, devices_per_node=8)
    ),
    "uneven-1-fast-pp2": lambda: _alg1(uneven_instance(1), [ParallelConfig(2)] * 3, 1, True),
    "uneven-2-beam2-pp1": lambda: _alg1(uneven_instance(2), [ParallelConfig(1)] * 4, 2, False),
    "sr-mixed-3": lambda: _sr(mixed_instance(3, n_models=8), 6),
    # the benchmark's two largest sizes (recorded: 5.5 s and 23.5 s before the search was made faster)
    "bench-32": lambda: _place(bench_instance(32), 32, 13 * GB, SearchOptions()),
    "bench-64": lambda: _place(bench_instance(64), 64, 13 * GB, SearchOptions()),
}
SLOW_CASES = ("bench-32", "bench-64")


def run_case(name: str) -> dict[str, object]:
    return CASES[name]()()


def record() -> None:
    out = {name: run_case(name) for name in CASES}
    RECORDED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(out)} plans to {RECORDED}")


if __name__ == "__main__":
    record()
