"""Let an external tuner (Katib, Optuna, Ray Tune) drive TrialGroups instead of our algorithms.

The tuner keeps its own search and pruning logic and speaks ask/tell, as Optuna's and Katib's suggestion
services do; the adapter turns each `ask` into a TrialGroup and each result into `tell`, whose answer
(prune or not) becomes the Decision. Fluid then places the group like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tessera.policy.hpo.base import Config, Decision, Result, TrialRun, TrialRunGroup, TuningAlgorithm


@dataclass(frozen=True, slots=True)
class Suggestion:
    trial_id: str
    config: Config
    budget: int
    report_every: int = 0


@runtime_checkable
class ExternalTuner(Protocol):
    def ask(self, n: int) -> list[Suggestion]:
        """Up to n new trials to run now (fewer, or none, is fine)."""
        ...

    def tell(self, trial_id: str, iteration: int, score: float) -> bool:
        """An intermediate or final result. Return False to prune (stop) the trial."""
        ...

    def done(self) -> bool:
        """True when the tuner will ask for nothing more."""
        ...


@dataclass
class ExternalTunerAlgorithm(TuningAlgorithm):
    tuner: ExternalTuner
    label: str = "external"
    _open: set[str] = field(default_factory=set, init=False)
    _groups: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tuner, ExternalTuner):
            raise TypeError(f"{type(self.tuner).__name__} does not implement ask/tell/done (ExternalTuner)")
        self.name = self.label
        self.synchronous = False

    def next_groups(self, slots: int, now: float) -> list[TrialRunGroup]:
        if slots <= 0:
            return []
        suggestions = self.tuner.ask(slots)[:slots]
        if not suggestions:
            return []
        trials = []
        for s in suggestions:
            if s.trial_id in self._open:
                raise ValueError(f"external tuner reused the id of running trial {s.trial_id!r}")
            ms = tuple(range(s.report_every, s.budget, s.report_every)) if s.report_every else ()
            trials.append(TrialRun(s.trial_id, s.config, s.budget, milestones=ms))
            self._open.add(s.trial_id)
        self._groups += 1
        return [TrialRunGroup(f"ext{self._groups - 1}", tuple(trials))]

    def on_result(self, result: Result) -> Decision:
        keep = self.tuner.tell(result.trial_id, result.iteration, result.score)
        return Decision.CONTINUE if keep else Decision.STOP

    def on_trial_end(self, trial_id: str, now: float) -> None:
        self._open.discard(trial_id)

    def finished(self) -> bool:
        return self.tuner.done() and not self._open
