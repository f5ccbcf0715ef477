"""Each baseline's allocation rule on a tiny instance (Themis §6.1), and the shared contract."""

import math
import random

import pytest
from tessera.cluster import Cluster, Sensitivity
from tessera.policy.baselines import BASELINES, Drf, Gandiva, Optimus, Slaq, Srsf, Srtf, Tiresias
from tessera.policy.training import AppState, check_decision


class _Est:
    def __init__(self, work: float, demand: int) -> None:
        self.work, self.demand = work, demand

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        return math.inf if gpus <= 0 else self.work * slowdown / min(gpus, self.demand)


def _app(
    app_id: str,
    *,
    demand: int = 2,
    work: float = 1000,
    remaining: float | None = None,
    attained: float = 0.0,
    held: tuple[str, ...] = (),
    sens: Sensitivity | None = None,
) -> AppState:
    rem = work if remaining is None else remaining
    return AppState(
        app_id,
        0.0,
        demand,
        frozenset(held),
        sens or Sensitivity(),
        work,
        rem,
        attained,
        1.0,
        _Est(rem, demand),
    )


C = Cluster.build([(1, 2), (1, 1), (1, 1)], machines_per_rack=8)


def _first(policy, apps, free=None):  # type: ignore[no-untyped-def]
    free = free or C.gpu_ids[:2]
    d = policy.allocate(0.0, apps, C, free, random.Random(0))
    check_decision(d, apps, free)
    return d.grants[0].app_id, d


def test_tiresias_serves_least_attained_service() -> None:
    who, _ = _first(Tiresias(), [_app("old", attained=5000), _app("new", attained=10)])
    assert who == "new"


def test_srsf_serves_shortest_remaining_service() -> None:
    who, _ = _first(Srsf(), [_app("long", remaining=900), _app("short", remaining=100)])
    assert who == "short"


def test_srtf_serves_shortest_remaining_time() -> None:
    who, _ = _first(Srtf(), [_app("long", remaining=900), _app("short", remaining=100)])
    assert who == "short"


def test_gandiva_serves_best_placement_preference_and_packs() -> None:
    # Only the 2-GPU machine keeps a 2-GPU gang local; the network-intensive app values it more? Both get
    # score 1 there; with one free 2-GPU machine and a 1-GPU app, the gang app is placed on one machine.
    free = C.gpu_ids
    _who, d = _first(Gandiva(), [_app("gang", demand=2, sens=Sensitivity(cross_machine=1.29))], free)
    assert len(C.by_machine(d.grants[0].gpus)) == 1


def test_optimus_gives_a_gpu_to_the_app_with_nothing_first() -> None:
    who, _ = _first(Optimus(), [_app("has", held=(C.gpu_ids[3],)), _app("none")], C.gpu_ids[:1])
    assert who == "none"


def test_slaq_prefers_the_app_with_the_larger_loss_drop() -> None:
    who, _ = _first(Slaq(), [_app("late", remaining=50), _app("early", remaining=1000)], C.gpu_ids[:1])
    assert who == "early"


def test_drf_least_share_and_no_preemption() -> None:
    who, d = _first(Drf(), [_app("big", held=(C.gpu_ids[3],)), _app("small")], C.gpu_ids[:1])
    assert who == "small" and d.grants[0].expiry == math.inf


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_is_work_conserving_and_keeps_the_contract(name: str) -> None:
    rng = random.Random(7)
    c = Cluster.build([(2, 2), (1, 4), (1, 1)])
    for _ in range(10):
        apps = [
            _app(
                f"a{i}",
                demand=rng.randint(1, 5),
                remaining=rng.uniform(10, 1000),
                attained=rng.uniform(0, 100),
            )
            for i in range(rng.randint(1, 5))
        ]
        free = c.gpu_ids
        d = BASELINES[name]().allocate(0.0, apps, c, free, random.Random(0))
        check_decision(d, apps, free)
        assert sum(len(g.gpus) for g in d.grants) == min(len(free), sum(a.unmet for a in apps))


# --- GPU-choice rule (Themis §6.1: only Gandiva, SRTF and Optimus look at placement) -------------------

SPREAD = Cluster.build([(1, 2), (1, 2), (1, 2)], machines_per_rack=8)


def test_paper_default_gpu_choice_per_baseline() -> None:
    tight = {n for n, cls in BASELINES.items() if cls().placement == "tight"}
    assert tight == {"gandiva", "srtf", "optimus"}
    assert all(cls().placement == "any" for n, cls in BASELINES.items() if n not in tight)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_tight_keeps_a_gang_on_one_machine_and_any_takes_cluster_order(name: str) -> None:
    # Free: one GPU on each of m0 and m1, both GPUs of m2. A 2-GPU gang fits only on m2.
    free = [SPREAD.gpu_ids[1], SPREAD.gpu_ids[3], SPREAD.gpu_ids[4], SPREAD.gpu_ids[5]]
    apps = [_app("a", demand=2, sens=Sensitivity(cross_machine=1.5))]
    tight = BASELINES[name](placement="tight").allocate(0.0, apps, SPREAD, free, random.Random(0))
    anyp = BASELINES[name](placement="any").allocate(0.0, apps, SPREAD, free, random.Random(0))
    assert {SPREAD.gpu(g).node for g in tight.granted()["a"]} == {SPREAD.gpu(free[2]).node}
    assert anyp.granted()["a"] == free[:2]  # first free GPUs in cluster order: two machines


def test_random_gpu_choice_follows_the_seeded_rng() -> None:
    free = list(SPREAD.gpu_ids)
    apps = [_app("a", demand=3)]
    draws = {
        tuple(Tiresias(placement="random").allocate(0.0, apps, SPREAD, free, random.Random(s)).granted()["a"])
        for s in range(8)
    }
    assert len(draws) > 1
    again = Tiresias(placement="random").allocate(0.0, apps, SPREAD, free, random.Random(3)).granted()["a"]
    assert (
        again
        == Tiresias(placement="random").allocate(0.0, apps, SPREAD, free, random.Random(3)).granted()["a"]
    )


def test_unknown_gpu_choice_is_rejected() -> None:
    with pytest.raises(ValueError, match="placement must be one of tight, any, random"):
        Gandiva(placement="packed")
