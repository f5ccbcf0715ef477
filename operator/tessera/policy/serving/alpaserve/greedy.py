"""Algorithm 1 (simulator-guided greedy model selection, with beam search) and the fast heuristic.

AlpaServe §4.2. Given fixed groups and configs, add one model replica at
a time; each candidate is scored by simulating the workload. The best selection seen in any iteration is
returned, not the last (Alg. 1 lines 16–18): an extra replica can attract traffic and hurt others.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.policy.serving.alpaserve.incremental import ComponentCache
from tessera.policy.serving.alpaserve.placement import Group, MemoryRule, ModelPlacement, stage_memory
from tessera.policy.serving.alpaserve.profiles import ModelProfile, ParallelConfig
from tessera.policy.serving.alpaserve.simulator import SimStats, simulate
from tessera.policy.serving.alpaserve.workload import Workload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scored:
    placement: ModelPlacement
    stats: SimStats
    score: float
    simulations: int = 0

    @property
    def attainment(self) -> float:
        return self.stats.attainment


def evaluate(
    placement: ModelPlacement,
    profiles: Mapping[str, ModelProfile],
    workload: Workload,
    *,
    fixed_overhead_s: float = 0.0,
) -> Scored:
    stats = simulate(placement, profiles, workload, fixed_overhead_s=fixed_overhead_s)
    return Scored(placement, stats, stats.score(placement.num_replicas()), 1)


class _Scorer:
    """``evaluate`` for a run of placements that differ by a replica at a time: the simulation of every
    component the step left alone is reused (``ComponentCache``); same scores as ``evaluate``."""

    def __init__(
        self, profiles: Mapping[str, ModelProfile], workload: Workload, fixed_overhead_s: float
    ) -> None:
        self._cache = ComponentCache(profiles, workload, fixed_overhead_s=fixed_overhead_s)

    def __call__(
        self, placement: ModelPlacement, parent: tuple[ModelPlacement, int, str] | None = None
    ) -> Scored:
        stats = self._cache.simulate(placement, parent)
        return Scored(placement, stats, stats.score(placement.num_replicas()), 1)


class _Fits:
    """``fits`` with each group's per-stage memory totals computed once (the totals are summed in the
    group's model order, exactly as ``fits`` does, so the answers are the same)."""

    def __init__(self, profiles: Mapping[str, ModelProfile], budget_bytes: float, rule: MemoryRule) -> None:
        self.profiles, self.budget, self.rule = profiles, budget_bytes * (1 + 1e-12), rule
        self._used: dict[tuple[ParallelConfig, tuple[str, ...]], list[float]] = {}
        self._add: dict[tuple[str, ParallelConfig], list[float] | None] = {}

    def __call__(self, group: Group, model: str) -> bool:
        cfg = group.config
        if (model, cfg) not in self._add:
            prof = self.profiles[model]
            w = prof.stages(cfg).stage_weight_bytes if prof.supports(cfg) else None
            self._add[(model, cfg)] = (
                None if w is None else list(w) if self.rule == "per_stage" else [max(w)] * len(w)
            )
        add = self._add[(model, cfg)]
        if add is None or model in group.models:
            return False
        key = (cfg, group.models)
        cur = self._used.get(key)
        if cur is None:
            cur = self._used[key] = stage_memory(group, self.profiles, self.rule)
        budget = self.budget
        return all(c + a <= budget for c, a in zip(cur, add, strict=True))


def greedy_selection(
    models: Sequence[str],
    base: ModelPlacement,
    profiles: Mapping[str, ModelProfile],
    workload: Workload,
    budget_bytes: float,
    *,
    beam_size: int = 1,
    memory_rule: MemoryRule = "per_stage",
    fixed_overhead_s: float = 0.0,
) -> Scored:
    """Algorithm 1. ``workload`` should hold only ``models``' requests (a bucket's share of W)."""
    if beam_size < 1:
        raise ValueError(f"beam size must be ≥ 1, got {beam_size}")
    score = _Scorer(profiles, workload, fixed_overhead_s)
    fits = _Fits(profiles, budget_bytes, memory_rule)
    best = score(base)
    sims = 1
    beam = [base]
    visited = {base.key()}
    while True:
        new: list[Scored] = []
        for sel in beam:
            for m in models:
                for gi, g in enumerate(sel.groups):
                    if not fits(g, m):
                        continue
                    cand = sel.with_model(gi, m)
                    key = cand.key()
                    if key in visited:
                        continue
                    visited.add(key)
                    new.append(score(cand, (sel, gi, m)))
                    sims += 1
        if not new:
            break
        new.sort(key=lambda s: -s.score)  # stable: ties keep enumeration order (determinism)
        beam = [s.placement for s in new[:beam_size]]
        if new[0].score > best.score:
            best = new[0]
    log.debug("greedy selection: %d simulations, attainment %.4f", sims, best.attainment)
    return Scored(best.placement, best.stats, best.score, sims)


def fast_greedy_selection(
    models: Sequence[str],
    base: ModelPlacement,
    profiles: Mapping[str, ModelProfile],
    workload: Workload,
    budget_bytes: float,
    *,
    memory_rule: MemoryRule = "per_stage",
    fixed_overhead_s: float = 0.0,
) -> Scored:
    """The fast heuristic (AlpaServe §4.2; ``replica_placement_fast_greedy`` in the authors' code): simulate once per added
    replica, then put the model with the most unserved requests on the least-loaded group (fewest routed
    requests) that has room for it. O((M+G)·R·S)."""
    names = workload.model_names
    index = {m: names.index(m) for m in models if m in names}
    score = _Scorer(profiles, workload, fixed_overhead_s)
    fits = _Fits(profiles, budget_bytes, memory_rule)
    sol = base
    cur = score(sol)
    best, sims = cur, 1
    while True:
        unserved = cur.stats.per_model_requests() - cur.stats.per_model_good()
        # most unserved first; ties keep the given model order
        order = sorted(models, key=lambda m: -int(unserved[index[m]]) if m in index else 0)
        load = cur.stats.per_group_requests()
        groups = [int(i) for i in np.argsort(load, kind="stable")]
        pick = next(
            ((gi, m) for gi in groups for m in order if fits(sol.groups[gi], m)),
            None,
        )
        if pick is None:
            break
        prev, sol = sol, sol.with_model(*pick)
        cur = score(sol, (prev, *pick))
        sims += 1
        if cur.score > best.score:
            best = cur
    return Scored(best.placement, best.stats, best.score, sims)
