"""Population Based Training (Jaderberg et al. 2017), asynchronous as in Ray Tune.

A constant population runs to `max_budget`, reporting every `interval` iterations. A trial in the bottom
quantile at a report exploits a random top-quantile trial: it stops, and a child starts from the top
trial's checkpoint (its iteration count) with a perturbed config. Tune does this in place; as a
TrialGroup event it is one trial leaving and one arriving, which is what the executor sees.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tessera.policy.hpo.base import (
    Decision,
    Result,
    TrialRun,
    TrialRunGroup,
    TuningAlgorithm,
    check_positive,
)
from tessera.policy.hpo.search_space import SearchSpace


@dataclass
class PBT(TuningAlgorithm):
    space: SearchSpace
    population: int
    max_budget: int
    interval: int
    rng: random.Random
    quantile: float = 0.25
    _latest: dict[str, float] = field(default_factory=dict, init=False)
    _configs: dict[str, dict[str, float]] = field(default_factory=dict, init=False)
    _pending: list[TrialRun] = field(default_factory=list, init=False)
    _open: set[str] = field(default_factory=set, init=False)
    _next: int = field(default=0, init=False)
    _started: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        check_positive(population=self.population, max_budget=self.max_budget, interval=self.interval)
        if not 0 < self.quantile <= 0.5:
            raise ValueError("quantile must be in (0, 0.5]")
        self.name = "pbt"
        self.synchronous = False

    def _spec(self, cfg: dict[str, float], start: int, parent: str | None) -> TrialRun:
        tid = f"t{self._next}"
        self._next += 1
        self._configs[tid] = cfg
        ms = tuple(m for m in range(self.interval, self.max_budget, self.interval) if m > start)
        return TrialRun(tid, cfg, self.max_budget, start=start, milestones=ms, parent=parent)

    def next_groups(self, slots: int, now: float) -> list[TrialRunGroup]:
        if not self._started:
            self._started = True
            self._pending = [self._spec(self.space.sample(self.rng), 0, None) for _ in range(self.population)]
        if not self._pending:
            return []
        trials, self._pending = tuple(self._pending), []
        self._open |= {t.trial_id for t in trials}
        return [TrialRunGroup(f"g{trials[0].trial_id}", trials)]

    def on_result(self, result: Result) -> Decision:
        self._latest[result.trial_id] = result.score
        if result.iteration >= self.max_budget:
            return Decision.CONTINUE
        live = {t: s for t, s in self._latest.items() if t in self._open}
        k = max(1, int(len(live) * self.quantile))
        if len(live) < 2:
            return Decision.CONTINUE
        ranked = sorted(live, key=lambda t: live[t])
        if result.trial_id not in ranked[:k]:
            return Decision.CONTINUE
        donor = self.rng.choice(ranked[-k:])
        child = self.space.perturb(self._configs[donor], self.rng)
        self._pending.append(self._spec(child, result.iteration, donor))
        return Decision.STOP

    def on_trial_end(self, trial_id: str, now: float) -> None:
        self._open.discard(trial_id)
        self._latest.pop(trial_id, None)

    def finished(self) -> bool:
        return self._started and not self._pending and not self._open
