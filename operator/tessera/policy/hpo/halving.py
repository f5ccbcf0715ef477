"""Synchronous stage-based algorithms: Successive Halving, Hyperband and synchronous BOHB.

Each rung of each bracket is one TrialGroup (Fluid, dissertation §3.3.2: all trials of one iteration form a
TrialGroup). A rung starts only when the previous one has ended; the top 1/η move on ("promote") and
continue from their checkpoint to the next budget. Brackets run one after another.
Hyperband (Li et al. 2018): s_max = ⌊log_η(R / r)⌋; bracket s has n = ⌈(s_max+1)/(s+1)·η^s⌉ configs
starting at budget R·η^{−s}. SyncBOHB samples each bracket's configs from the TPE model instead.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from tessera.policy.hpo.base import (
    Config,
    Decision,
    Result,
    TrialRun,
    TrialRunGroup,
    TuningAlgorithm,
    check_positive,
)
from tessera.policy.hpo.search_space import SearchSpace
from tessera.policy.hpo.tpe import TPESampler


@dataclass(frozen=True, slots=True)
class Bracket:
    n: int  # configurations in the first rung
    r: int  # budget of the first rung
    rungs: int


def hyperband_brackets(max_budget: int, min_budget: int, eta: int) -> list[Bracket]:
    check_positive(max_budget=max_budget, min_budget=min_budget)
    if eta < 2:
        raise ValueError(f"eta must be >= 2, got {eta}")
    if min_budget > max_budget:
        raise ValueError("min_budget must not exceed max_budget")
    s_max = math.floor(math.log(max_budget / min_budget, eta) + 1e-9)
    return [
        Bracket(math.ceil((s_max + 1) / (s + 1) * eta**s), max(1, round(max_budget / eta**s)), s + 1)
        for s in range(s_max, -1, -1)
    ]


@dataclass
class SyncHalving(TuningAlgorithm):
    space: SearchSpace
    brackets: list[Bracket]
    eta: int
    rng: random.Random
    sampler: TPESampler | None = None
    _queue: list[tuple[int, int]] = field(default_factory=list, init=False)  # (bracket, rung) to run
    _rung_members: list[tuple[str, Config]] = field(default_factory=list, init=False)
    _scores: dict[str, float] = field(default_factory=dict, init=False)
    _open: set[str] = field(default_factory=set, init=False)
    _next_id: int = field(default=0, init=False)
    _groups: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.brackets:
            raise ValueError("need at least one bracket")
        self._queue = [(b, k) for b, br in enumerate(self.brackets) for k in range(br.rungs)]

    def _budget(self, b: int, k: int) -> int:
        return int(self.brackets[b].r * self.eta**k)

    def next_groups(self, slots: int, now: float) -> list[TrialRunGroup]:
        if self._open or not self._queue:
            return []
        b, k = self._queue.pop(0)
        br = self.brackets[b]
        if k == 0:
            members: list[tuple[str, Config]] = []
            for _ in range(br.n):
                cfg = self.sampler.sample(self.rng) if self.sampler else self.space.sample(self.rng)
                members.append((f"t{self._next_id}", cfg))
                self._next_id += 1
            start = 0
        else:
            keep = max(1, br.n // self.eta**k)
            ranked = sorted(self._rung_members, key=lambda m: -self._scores[m[0]])  # stable on ties
            members = ranked[:keep]
            start = self._budget(b, k - 1)
        self._rung_members = members
        budget = self._budget(b, k)
        trials = tuple(TrialRun(tid, cfg, budget, start=start) for tid, cfg in members)
        self._open = {t.trial_id for t in trials}
        self._groups += 1
        return [TrialRunGroup(f"g{self._groups - 1}-b{b}r{k}", trials)]

    def on_result(self, result: Result) -> Decision:
        self._scores[result.trial_id] = result.score
        if self.sampler is not None:
            cfg = dict(self._rung_members)[result.trial_id]
            self.sampler.observe(cfg, result.iteration, result.score)
        return Decision.CONTINUE

    def on_trial_end(self, trial_id: str, now: float) -> None:
        self._open.discard(trial_id)

    def finished(self) -> bool:
        return not self._queue and not self._open


def successive_halving(
    space: SearchSpace, n: int, min_budget: int, eta: int, rng: random.Random, max_budget: int | None = None
) -> SyncHalving:
    rungs = 1 + math.floor(math.log(max(n, 1), eta) + 1e-9)
    if max_budget is not None:
        rungs = min(rungs, 1 + math.floor(math.log(max_budget / min_budget, eta) + 1e-9))
    alg = SyncHalving(space, [Bracket(n, min_budget, rungs)], eta, rng)
    alg.name = "sh"
    return alg


def hyperband(
    space: SearchSpace, max_budget: int, min_budget: int, eta: int, rng: random.Random
) -> SyncHalving:
    alg = SyncHalving(space, hyperband_brackets(max_budget, min_budget, eta), eta, rng)
    alg.name = "hyperband"
    return alg


def sync_bohb(
    space: SearchSpace, max_budget: int, min_budget: int, eta: int, rng: random.Random
) -> SyncHalving:
    alg = SyncHalving(space, hyperband_brackets(max_budget, min_budget, eta), eta, rng, TPESampler(space))
    alg.name = "syncbohb"
    return alg
