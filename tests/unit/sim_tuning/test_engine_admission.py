"""Admission of late-arriving trials and the planning horizon in the tuning simulator."""

from dataclasses import dataclass, field

import pytest
from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig
from tessera.policy.hpo import ExternalTunerAlgorithm, Suggestion
from tessera.sim.tuning.engine import TuningSim
from tessera.sim.tuning.fixed_group import FixedHeights


@dataclass
class ScriptedTuner:
    """An ask/tell tuner that hands out wave k of suggestions once k results have come back."""

    waves: list[list[Suggestion]]
    told: list[str] = field(default_factory=list)
    handed: int = 0

    def ask(self, n: int) -> list[Suggestion]:
        if self.handed >= len(self.waves) or len(self.told) < self.handed:
            return []
        self.handed += 1
        return self.waves[self.handed - 1][:n]

    def tell(self, trial_id: str, iteration: int, score: float) -> bool:
        self.told.append(trial_id)
        return True

    def done(self) -> bool:
        return self.handed >= len(self.waves)


@dataclass
class Recorded(ExternalTunerAlgorithm):
    """Records when each trial leaves its group."""

    finish: dict[str, float] = field(default_factory=dict)

    def on_trial_end(self, trial_id: str, now: float) -> None:
        self.finish[trial_id] = now
        super().on_trial_end(trial_id, now)


def _run(waves: list[list[Suggestion]], gpus: int, c: int) -> dict[str, float]:
    cluster = Cluster.homogeneous(1, gpus)
    alg = Recorded(ScriptedTuner(waves))
    TuningSim(cluster, cluster.gpu_ids, FixedHeights(), alg, "fluid", FluidConfig(max_pack=c)).run()
    return alg.finish


def test_late_single_trial_packs_into_an_open_lane() -> None:
    # One GPU, c = 2: a (h = 100 s) and b (h = 10 s) share it; when b ends, c (h = 10 s) arrives alone.
    # No GPU is idle, so Alg. 3.1's floor is 0 → width 1/c: c joins a's GPU instead of waiting for a.
    waves = [
        [Suggestion("a", {"h": 100.0}, 1), Suggestion("b", {"h": 10.0}, 1)],
        [Suggestion("c", {"h": 10.0}, 1)],
    ]
    finish = _run(waves, gpus=1, c=2)
    assert finish["b"] == pytest.approx(10.0)
    assert finish["c"] == pytest.approx(20.0)  # started at 10 s, not after a (100 s)
    assert finish["a"] == pytest.approx(100.0)


def test_horizon_must_be_known() -> None:
    cluster = Cluster.homogeneous(1, 1)
    alg = ExternalTunerAlgorithm(ScriptedTuner([[Suggestion("a", {"h": 1.0}, 1)]]))
    with pytest.raises(ValueError, match="horizon"):
        TuningSim(cluster, cluster.gpu_ids, FixedHeights(), alg, "fluid", horizon="forever")  # type: ignore[arg-type]
