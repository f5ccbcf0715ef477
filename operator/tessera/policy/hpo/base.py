"""The interface between tuning algorithms and the execution engine (Fluid, dissertation §3.3.3, Fig. 3.4).

Algorithms emit TrialGroups and react to intermediate results with decisions, in the shape of Ray Tune's
schedulers. They never choose placement or worker counts: that is Fluid's job (or FIFO's, for the
baseline). Configurations are points in the unit cube; a workload maps them to real hyperparameters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

Config = Mapping[str, float]


@dataclass(frozen=True, slots=True)
class TrialRun:
    """Run `config` from iteration `start` (a checkpoint) up to `budget`, reporting at each milestone.

    A promoted trial reappears with the same id and a larger budget; a PBT child names its `parent`,
    whose checkpoint it starts from.
    """

    trial_id: str
    config: Config
    budget: int
    start: int = 0
    milestones: tuple[int, ...] = ()
    parent: str | None = None

    def __post_init__(self) -> None:
        if self.budget <= self.start:
            raise ValueError(f"trial {self.trial_id}: budget {self.budget} must exceed start {self.start}")
        if any(not self.start < m < self.budget for m in self.milestones):
            raise ValueError(f"trial {self.trial_id}: milestones must lie strictly between start and budget")


@dataclass(frozen=True, slots=True)
class TrialRunGroup:
    group_id: str
    trials: tuple[TrialRun, ...]


@dataclass(frozen=True, slots=True)
class Result:
    trial_id: str
    iteration: int
    score: float  # higher is better
    now: float


class Decision(Enum):
    CONTINUE = "continue"
    PROMOTE = "promote"  # passed a rung: keep training towards the next one
    STOP = "stop"


@dataclass
class TuningAlgorithm(ABC):
    """Reacts to results and emits TrialGroups. Deterministic for a given seed and result sequence."""

    name: str = field(init=False, default="algorithm")
    synchronous: bool = field(init=False, default=True)

    @abstractmethod
    def next_groups(self, slots: int, now: float) -> list[TrialRunGroup]:
        """New TrialGroups to run now. `slots` = how many more trials the executor can run at once
        (asynchronous algorithms size their launches by it; synchronous ones ignore it)."""

    @abstractmethod
    def on_result(self, result: Result) -> Decision:
        """An intermediate result at a milestone or at the end of the trial's budget."""

    @abstractmethod
    def on_trial_end(self, trial_id: str, now: float) -> None:
        """The trial left its group: budget reached or stopped."""

    @abstractmethod
    def finished(self) -> bool:
        """True when the algorithm will emit nothing more."""


def check_positive(**values: float) -> None:
    for k, v in values.items():
        if v <= 0:
            raise ValueError(f"{k} must be > 0, got {v}")
