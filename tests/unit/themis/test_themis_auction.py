"""Partial-allocation auction: Figure 5 placements, hidden payments, brute-force NSW optimality
(Themis §3.1.2, §3.3.1, Theorem 3.1)."""

import itertools
import math
import random

import pytest
from tessera.cluster import Cluster, Sensitivity
from tessera.cluster.pool import FreePool
from tessera.policy.themis.auction import run_auction
from tessera.policy.themis.bids import make_bid
from tessera.policy.themis.nsw import exact_nsw, greedy_nsw, objective

from .themis_helpers import FLAT, app

VGG16 = Sensitivity(1.0, 1.0, 1.29, 1.29)
INCEPTION = Sensitivity(1.0, 1.0, 1.0, 1.0)


def _bids(apps, cluster, offer):
    return [make_bid(a, 0.0, cluster, len(offer)) for a in apps]


def test_figure5_instance1_each_app_gets_a_whole_machine() -> None:
    c = Cluster.build([(1, 4), (1, 4)])
    apps = [app("a1", 4000, 4, sens=VGG16), app("a2", 4000, 4, sens=VGG16)]
    offer = c.gpu_ids
    res = run_auction(_bids(apps, c, offer), c, offer, solver="exact")
    for a in ("a1", "a2"):
        assert len(res.won[a]) == 4
        assert len(c.by_machine(res.won[a])) == 1, "a VGG16 app must not be spread across servers"
        assert res.payment[a] == pytest.approx(1.0)
    assert res.leftover == []


@pytest.mark.parametrize("solver", ["exact", "greedy"])
def test_figure5_instance2_network_intensive_app_gets_the_big_machine(solver: str) -> None:
    c = Cluster.build([(1, 4), (1, 2), (1, 2)])
    a1 = app("a1", 4000, 4, sens=INCEPTION)
    a2 = app("a2", 4000, 4, sens=VGG16)
    offer = c.gpu_ids
    res = run_auction(_bids([a1, a2], c, offer), c, offer, solver=solver)  # type: ignore[arg-type]
    assert set(c.by_machine(res.won["a2"])) == {"m000"}
    assert set(c.by_machine(res.won["a1"])) == {"m001", "m002"}
    assert res.payment == {"a1": pytest.approx(1.0), "a2": pytest.approx(1.0)}
    assert res.leftover == []


def test_hidden_payments_two_identical_apps_on_one_machine() -> None:
    c = Cluster.build([(1, 4)])
    apps = [app("a1", 4000, 4, n_avg=1.0), app("a2", 4000, 4, n_avg=1.0)]
    offer = c.gpu_ids
    bids = _bids(apps, c, offer)
    assert bids[0].rho(1, bids[0].held.locality()) == pytest.approx(4.0)  # ρ = 4 / k
    res = run_auction(bids, c, offer, solver="exact", min_keep=0)
    assert sorted(len(v) for v in res.pf.values()) == [2, 2]
    assert res.payment["a1"] == pytest.approx(0.5)
    assert res.payment["a2"] == pytest.approx(0.5)
    assert len(res.won["a1"]) == len(res.won["a2"]) == 1
    assert len(res.leftover) == 2
    assert sum(len(v) for v in res.won.values()) + len(res.leftover) == len(offer)


def test_one_bidder_pays_nothing() -> None:
    c = Cluster.build([(1, 4)])
    res = run_auction(_bids([app("a", 4000, 4)], c, c.gpu_ids), c, c.gpu_ids)
    assert res.payment["a"] == 1.0 and len(res.won["a"]) == 4 and res.leftover == []


def test_non_competing_bidders_pay_nothing() -> None:
    c = Cluster.build([(1, 4), (1, 4)])
    apps = [app("a", 4000, 2), app("b", 4000, 3)]
    res = run_auction(_bids(apps, c, c.gpu_ids), c, c.gpu_ids, solver="exact")
    assert res.payment == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}
    assert (len(res.won["a"]), len(res.won["b"])) == (2, 3)
    assert len(res.leftover) == 3


def _random_instance(rng: random.Random, sensitive: bool):
    shapes = [(1, rng.choice((1, 2, 3))) for _ in range(rng.choice((2, 3)))]
    c = Cluster.build(shapes, machines_per_rack=2)
    ids = c.gpu_ids
    rng.shuffle(ids)
    n_held = rng.randint(0, 2)
    held, offer = ids[:n_held], ids[n_held:][:6]
    apps = []
    for i in range(rng.choice((2, 3))):
        sens = Sensitivity(1.0, 1.0, rng.choice((1.0, 1.29)), 1.5) if sensitive else FLAT
        mine = tuple(held[i : i + 1]) if i < len(held) else ()
        apps.append(
            app(
                f"a{i}",
                rng.uniform(500, 5000),
                rng.randint(1, 4) + len(mine),
                held=mine,
                sens=sens,
                arrival=-rng.uniform(0, 3000),
                n_avg=rng.uniform(1, 4),
            )
        )
    return c, apps, offer


@pytest.mark.parametrize("seed", range(25))
def test_greedy_matches_brute_force_on_identical_gpus(seed: int) -> None:
    """Separable concave case (ρ depends on the count only): greedy marginal gain is optimal."""
    rng = random.Random(seed)
    c, apps, offer = _random_instance(rng, sensitive=False)
    bids = _bids(apps, c, offer)
    exact = exact_nsw(bids, c, offer)
    greedy = greedy_nsw(bids, c, FreePool(c, offer))
    assert objective(bids, c, greedy) == pytest.approx(objective(bids, c, exact), abs=1e-9)


def test_greedy_is_near_brute_force_with_placement() -> None:
    """With locality-dependent slowdowns the greedy (+ local search) is a heuristic. Over 200 seeded
    instances it finds the brute-force optimum in >= 85 % of them, and its ∏ 1/ρ is never more than
    25 % off (measured: 177/200 optimal, p90 gap 1.9 %, worst 22.6 %)."""
    ratios = []
    for seed in range(200):
        rng = random.Random(1000 + seed)
        c, apps, offer = _random_instance(rng, sensitive=True)
        bids = _bids(apps, c, offer)
        gap = objective(bids, c, greedy_nsw(bids, c, FreePool(c, offer))) - objective(
            bids, c, exact_nsw(bids, c, offer)
        )
        assert gap >= -1e-9, "brute force must be optimal"
        ratios.append(math.exp(gap))
    assert sum(r <= 1 + 1e-9 for r in ratios) >= 170
    assert max(ratios) <= 1.25


@pytest.mark.parametrize("seed", range(15))
def test_auction_invariants(seed: int) -> None:
    rng = random.Random(seed)
    c, apps, offer = _random_instance(rng, sensitive=True)
    bids = _bids(apps, c, offer)
    res = run_auction(bids, c, offer, solver="exact")
    seen: set[str] = set()
    for b in bids:
        pf, won = set(res.pf[b.app_id]), set(res.won[b.app_id])
        assert won <= pf, "G_i ⊆ G_i,pf"
        assert not (pf & seen), "PF bundles are disjoint"
        seen |= pf
        assert 0 < res.payment[b.app_id] <= 1.0
        assert len(b.app.held) + len(won) <= b.app.demand_max
    assert seen <= set(offer)
    assert sum(len(v) for v in res.won.values()) + len(res.leftover) == len(offer)
    # PF optimality against the brute force: nothing beats Σ log(1/ρ) of the solution.
    assert objective(bids, c, res.pf) <= objective(bids, c, exact_nsw(bids, c, offer)) + 1e-9


def test_bid_rows_are_monotone_and_empty_row_is_max() -> None:
    c = Cluster.build([(2, 2), (1, 4)])
    b = make_bid(app("a", 4000, 6, sens=VGG16, arrival=-100, n_avg=2), 0.0, c, 8)
    rows = b.rows()
    assert rows[0][2] == max(r[2] for r in rows)
    by_loc: dict[str, list[tuple[int, float]]] = {}
    for k, loc, r in rows[1:]:
        by_loc.setdefault(loc, []).append((k, r))
    for series in by_loc.values():
        rs = [r for _, r in sorted(series)]
        assert all(x >= y - 1e-12 for x, y in itertools.pairwise(rs))


def _contended(n: int, seed: int = 7):
    """n bidders holding some GPUs, with 1-4 GPUs of unmet demand each, over n/2 offered GPUs on
    2-slot machines in 4-machine racks (placement-sensitive: locality changes the bids)."""
    rng = random.Random(seed)
    c = Cluster.build([(2, 4)] * max(2, n // 8), machines_per_rack=4)
    ids = list(c.gpu_ids)
    rng.shuffle(ids)
    held, offer = ids[: n // 4], ids[n // 4 :][: n // 2]
    apps = []
    for i in range(n):
        mine = tuple(held[i : i + 1]) if i < len(held) else ()
        sens = Sensitivity(1.0, 1.0, rng.choice((1.0, 1.1, 1.29)), 1.5)
        demand = rng.randint(1, 4) + len(mine)
        apps.append(app(f"a{i:03d}", rng.uniform(500, 5000), demand, held=mine, sens=sens, n_avg=n / 4))
    return c, apps, offer


@pytest.mark.parametrize("seed", range(3))
def test_shared_warm_starts_give_what_independent_ones_give(seed: int) -> None:
    """The N warm starts of an auction share the PF bundles' anchors and remember each bidder's
    evaluations by what they read of the pool; each G^{-i} must equal a warm start solved on its own."""
    c, apps, offer = _contended(48, seed)
    res = run_auction(_bids(apps, c, offer), c, offer, solver="greedy")
    fresh = _bids(apps, c, offer)  # no memo shared with the auction's bids
    for b in fresh:
        if not res.pf[b.app_id]:
            continue
        others = [o for o in fresh if o.app_id != b.app_id]
        alone = greedy_nsw(others, c, FreePool(c, res.pf[b.app_id]), start=res.pf)
        assert alone == res.without[b.app_id], b.app_id


def test_warm_starts_do_not_re_evaluate_every_bidder(monkeypatch: pytest.MonkeyPatch) -> None:
    """One warm start per PF winner, each handing that winner's few GPUs to the others: the bidders it
    leaves untouched are answered from the auction's memory, so the placement predictions grow about
    linearly with the bidders (each warm start re-predicting every bidder made a 1000-App round's auction
    O(N²): 2 s of the operator's loop)."""
    calls = {"n": 0}
    predict = FreePool.predict

    def counted(self: FreePool, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return predict(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FreePool, "predict", counted)
    per_size = []
    for n in (256, 512):
        c, apps, offer = _contended(n)
        calls["n"] = 0
        run_auction(_bids(apps, c, offer), c, offer, solver="greedy")
        per_size.append(calls["n"])
    assert per_size[1] < 3 * per_size[0], per_size  # twice the bidders: 4x the predictions if quadratic
