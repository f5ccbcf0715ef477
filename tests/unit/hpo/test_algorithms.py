"""Tuning algorithms: group shapes, promotion/stop decisions, determinism, the external-tuner adapter."""

import random
from dataclasses import dataclass, field

import pytest
from tessera.cluster import Cluster
from tessera.policy.fluid import FluidConfig
from tessera.policy.hpo import (
    PBT,
    Decision,
    ExternalTunerAlgorithm,
    Result,
    SearchSpace,
    Suggestion,
    asha,
    hyperband,
    hyperband_brackets,
    successive_halving,
)
from tessera.sim.tuning.engine import TuningSim
from tessera.sim.tuning.workload import TuningWorkload

SPACE = SearchSpace(("x0", "x1"))


def test_hyperband_brackets_match_li_et_al() -> None:
    # R = 81, η = 3 (Hyperband paper, Table 1): n = 81, 34, 15, 8, 5; r = 1, 3, 9, 27, 81
    b = hyperband_brackets(81, 1, 3)
    assert [(x.n, x.r, x.rungs) for x in b] == [(81, 1, 5), (34, 3, 4), (15, 9, 3), (8, 27, 2), (5, 81, 1)]


def test_successive_halving_promotes_top_third() -> None:
    alg = successive_halving(SPACE, 9, 1, 3, random.Random(0))
    (g0,) = alg.next_groups(0, 0.0)
    assert len(g0.trials) == 9 and all(t.budget == 1 for t in g0.trials)
    assert alg.next_groups(0, 0.0) == []  # synchronous: waits for the rung
    for i, t in enumerate(g0.trials):
        alg.on_result(Result(t.trial_id, 1, float(i), 1.0))
        alg.on_trial_end(t.trial_id, 1.0)
    (g1,) = alg.next_groups(0, 1.0)
    assert [t.trial_id for t in g1.trials] == ["t8", "t7", "t6"]
    assert all(t.start == 1 and t.budget == 3 for t in g1.trials)


def test_asha_stops_below_quantile_and_promotes_above() -> None:
    alg = asha(SPACE, 10, 9, 1, 3, random.Random(0))
    (g,) = alg.next_groups(4, 0.0)
    assert len(g.trials) == 4 and g.trials[0].milestones == (1, 3)
    assert alg.on_result(Result("t0", 1, 0.5, 1.0)) == Decision.PROMOTE
    assert alg.on_result(Result("t1", 1, 0.9, 1.0)) == Decision.PROMOTE
    assert alg.on_result(Result("t2", 1, 0.1, 1.0)) == Decision.STOP


def test_pbt_exploits_top_trial() -> None:
    alg = PBT(SPACE, 4, 10, 2, random.Random(0))
    (g,) = alg.next_groups(0, 0.0)
    for i, t in enumerate(g.trials[:3]):
        assert alg.on_result(Result(t.trial_id, 2, 0.5 + i * 0.1, 1.0)) == Decision.CONTINUE
    assert alg.on_result(Result("t3", 2, 0.1, 1.0)) == Decision.STOP
    alg.on_trial_end("t3", 1.0)
    (child,) = alg.next_groups(0, 1.0)
    assert child.trials[0].start == 2 and child.trials[0].parent in {"t0", "t1", "t2"}


@pytest.mark.parametrize("name", ["hyperband", "asha"])
def test_deterministic_for_a_seed(name: str) -> None:
    def once() -> tuple[float, float | None]:
        w = TuningWorkload(seed=3)
        alg = (
            hyperband(w.space, 27, 1, 3, random.Random(5))
            if name == "hyperband"
            else asha(w.space, 20, 27, 1, 3, random.Random(5))
        )
        c = Cluster.homogeneous(1, 4)
        r = TuningSim(c, c.gpu_ids, w, alg, "fluid", FluidConfig()).run()
        return r.makespan, r.time_to_target

    assert once() == once()


@dataclass
class MedianPruningTuner:
    """A small ask/tell tuner with median pruning, standing in for Optuna/Katib behind the protocol."""

    n_trials: int
    rng: random.Random
    asked: int = 0
    history: dict[int, list[float]] = field(default_factory=dict)
    told: list[tuple[str, int, float]] = field(default_factory=list)

    def ask(self, n: int) -> list[Suggestion]:
        k = min(n, self.n_trials - self.asked)
        out = [
            Suggestion(f"ext-{self.asked + i}", SPACE.sample(self.rng) | {"x2": 0.5}, 8, 2) for i in range(k)
        ]
        self.asked += k
        return out

    def tell(self, trial_id: str, iteration: int, score: float) -> bool:
        self.told.append((trial_id, iteration, score))
        seen = self.history.setdefault(iteration, [])
        seen.append(score)
        return score >= sorted(seen)[len(seen) // 2] or len(seen) < 3

    def done(self) -> bool:
        return self.asked >= self.n_trials


def test_external_tuner_drives_trial_groups_under_fluid() -> None:
    tuner = MedianPruningTuner(12, random.Random(1))
    w = TuningWorkload(dims=3, seed=1)
    c = Cluster.homogeneous(1, 4)
    sim = TuningSim(c, c.gpu_ids, w, ExternalTunerAlgorithm(tuner), "fluid", FluidConfig(max_pack=2))
    r = sim.run()
    assert tuner.asked == 12 and r.trials == 12
    assert {t for t, _, _ in tuner.told} == {f"ext-{i}" for i in range(12)}
    pruned = [t for t in {t for t, _, _ in tuner.told} if max(i for x, i, _ in tuner.told if x == t) < 8]
    assert pruned  # median pruning stopped some trials early through Decision.STOP
    assert r.groups >= 2  # first ask fills c·n = 8 slots; later asks fill freed slots


def test_external_tuner_must_implement_protocol() -> None:
    with pytest.raises(TypeError, match="ask/tell/done"):
        ExternalTunerAlgorithm(object())  # type: ignore[arg-type]
