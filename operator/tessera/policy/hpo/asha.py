"""Asynchronous algorithms: ASHA and (asynchronous) BOHB, in Ray Tune's AsyncHyperBand form.

Fluid was built on Ray Tune (dissertation §3.5), so we follow Tune's ASHA: each trial reports at rung
milestones r_min·η^k < R; it stops if its score is below the (1 − 1/η) quantile of the scores
recorded at that rung so far, else it is promoted onward. New trials are launched whenever the executor
has free slots, up to `num_samples` (the concurrency is the executor's, §3.6.2).
BOHB here is that same asynchronous loop with configs drawn from the TPE model (tpe.py) over results.
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
from tessera.policy.hpo.tpe import TPESampler


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), so cutoffs match Tune's np.nanpercentile."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class ASHA(TuningAlgorithm):
    space: SearchSpace
    num_samples: int
    max_budget: int
    min_budget: int
    eta: int
    rng: random.Random
    sampler: TPESampler | None = None
    _rungs: dict[int, list[float]] = field(default_factory=dict, init=False)
    _configs: dict[str, dict[str, float]] = field(default_factory=dict, init=False)
    _open: set[str] = field(default_factory=set, init=False)
    _launched: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        check_positive(num_samples=self.num_samples, max_budget=self.max_budget, min_budget=self.min_budget)
        if self.eta < 2:
            raise ValueError(f"eta must be >= 2, got {self.eta}")
        self.name = "bohb" if self.sampler else "asha"
        self.synchronous = False
        ms, r = [], self.min_budget
        while r < self.max_budget:
            ms.append(r)
            r *= self.eta
        self.milestones = tuple(ms)
        self._rungs = {m: [] for m in ms}

    def next_groups(self, slots: int, now: float) -> list[TrialRunGroup]:
        k = min(slots, self.num_samples - self._launched)
        if k <= 0:
            return []
        trials = []
        for _ in range(k):
            tid = f"t{self._launched}"
            cfg = self.sampler.sample(self.rng) if self.sampler else self.space.sample(self.rng)
            self._configs[tid] = cfg
            trials.append(TrialRun(tid, cfg, self.max_budget, milestones=self.milestones))
            self._launched += 1
            self._open.add(tid)
        return [TrialRunGroup(f"g{trials[0].trial_id}", tuple(trials))]

    def on_result(self, result: Result) -> Decision:
        if self.sampler is not None:
            self.sampler.observe(self._configs[result.trial_id], result.iteration, result.score)
        rung = self._rungs.get(result.iteration)
        if rung is None:
            return Decision.CONTINUE  # the final result at max_budget
        rung.append(result.score)
        cutoff = _quantile(rung, 1.0 - 1.0 / self.eta)
        return Decision.STOP if result.score < cutoff else Decision.PROMOTE

    def on_trial_end(self, trial_id: str, now: float) -> None:
        self._open.discard(trial_id)

    def finished(self) -> bool:
        return self._launched >= self.num_samples and not self._open


def asha(
    space: SearchSpace, num_samples: int, max_budget: int, min_budget: int, eta: int, rng: random.Random
) -> ASHA:
    return ASHA(space, num_samples, max_budget, min_budget, eta, rng)


def bohb(
    space: SearchSpace, num_samples: int, max_budget: int, min_budget: int, eta: int, rng: random.Random
) -> ASHA:
    return ASHA(space, num_samples, max_budget, min_budget, eta, rng, TPESampler(space))
