"""Grid and random search: one TrialGroup with every trial at a fixed budget (Fluid, dissertation §3.3.2)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tessera.policy.hpo.base import Config, Decision, Result, TrialRun, TrialRunGroup, TuningAlgorithm
from tessera.policy.hpo.search_space import SearchSpace


@dataclass
class OneGroupSearch(TuningAlgorithm):
    configs: list[Config]
    budget: int
    report_every: int = 0  # milestones for intermediate results (0: only at the end)
    _emitted: bool = field(default=False, init=False)
    _open: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        if not self.configs:
            raise ValueError(f"{self.name}: no configurations to try")
        if self.budget < 1:
            raise ValueError(f"{self.name}: budget must be >= 1 iteration")

    def next_groups(self, slots: int, now: float) -> list[TrialRunGroup]:
        if self._emitted:
            return []
        self._emitted = True
        ms = tuple(range(self.report_every, self.budget, self.report_every)) if self.report_every else ()
        trials = tuple(TrialRun(f"t{i}", c, self.budget, milestones=ms) for i, c in enumerate(self.configs))
        self._open = {t.trial_id for t in trials}
        return [TrialRunGroup("g0", trials)]

    def on_result(self, result: Result) -> Decision:
        return Decision.CONTINUE

    def on_trial_end(self, trial_id: str, now: float) -> None:
        self._open.discard(trial_id)

    def finished(self) -> bool:
        return self._emitted and not self._open


@dataclass
class GridSearch(OneGroupSearch):
    def __post_init__(self) -> None:
        self.name = "grid"
        super().__post_init__()

    @staticmethod
    def over(space: SearchSpace, points_per_dim: int, budget: int, report_every: int = 0) -> GridSearch:
        return GridSearch(list(space.grid(points_per_dim)), budget, report_every)


@dataclass
class RandomSearch(OneGroupSearch):
    def __post_init__(self) -> None:
        self.name = "random"
        super().__post_init__()

    @staticmethod
    def sample(
        space: SearchSpace, n: int, budget: int, rng: random.Random, report_every: int = 0
    ) -> RandomSearch:
        return RandomSearch([space.sample(rng) for _ in range(n)], budget, report_every)
