"""The arbiter round: filter (Themis §3.3.2), leftover work conservation and leases (§3.3.1–3.3.2)."""

import random

import pytest
from tessera.cluster import Cluster
from tessera.policy.themis import Themis, ThemisConfig, admit, filter_apps, participants
from tessera.policy.training import check_decision

from .themis_helpers import app


@pytest.mark.parametrize(("f", "k"), [(0.8, 2), (0.0, 10), (1.0, 1), (0.5, 5)])
def test_participants(f: float, k: int) -> None:
    assert participants(10, f) == k


def test_filter_takes_highest_rho_and_breaks_ties_by_arrival() -> None:
    apps = [app(f"a{i}", 100, 1, arrival=float(i)) for i in range(10)]
    ranked = [(float(i % 3), a) for i, a in enumerate(apps)]
    top = filter_apps(ranked, 0.8)
    assert [a.app_id for a in top] == ["a2", "a5"]  # ρ = 2, earliest arrivals first
    assert [a.app_id for a in filter_apps(ranked, 1.0)] == ["a2"]


def test_config_validation_messages() -> None:
    with pytest.raises(ValueError, match="fairness_knob"):
        ThemisConfig(fairness_knob=1.5)
    with pytest.raises(ValueError, match="lease_s"):
        ThemisConfig(lease_s=0)


def test_starving_app_is_filtered_in_and_wins() -> None:
    """Spec §6.5 read literally (`starving_rank: cap`): holding nothing ranks first and wins."""
    c = Cluster.build([(1, 4), (1, 4)])
    held = c.gpu_ids[:7]
    apps = [app(f"r{i}", 1000, 2, held=tuple(held[i * 2 : i * 2 + 2]), arrival=-500) for i in range(3)]
    apps.append(app("r3", 1000, 2, held=(held[6],), arrival=-500))
    apps.append(app("starved", 1000, 2, arrival=-10))  # holds nothing → ρ = ρ_cap
    t = Themis(ThemisConfig(fairness_knob=0.8, starving_rank="cap"))
    assert t.current_rho(apps[-1], 0.0, c) == t.config.rho_cap
    d = t.allocate(0.0, apps, c, c.gpu_ids[7:], random.Random(0))
    got = d.granted()
    assert got.get("starved"), "the starving app must win the offered GPU"
    assert d.record["participants"][0]["app"] == "starved"


@pytest.mark.parametrize("seed", range(20))
def test_round_is_work_conserving_and_respects_leases(seed: int) -> None:
    rng = random.Random(seed)
    c = Cluster.build([(2, 2)] * 3 + [(1, 4)] * 2, machines_per_rack=2)
    ids = c.gpu_ids
    rng.shuffle(ids)
    apps, pos = [], 0
    for i in range(rng.randint(2, 8)):
        h = rng.randint(0, 2)
        apps.append(
            app(
                f"a{i}",
                rng.uniform(100, 10_000),
                h + rng.randint(0, 4),
                held=tuple(ids[pos : pos + h]),
                arrival=-rng.uniform(0, 5000),
                n_avg=rng.uniform(1, 5),
            )
        )
        pos += h
    free = ids[pos:]
    t = Themis(ThemisConfig(fairness_knob=rng.choice((0.0, 0.5, 0.8, 1.0)), lease_s=300))
    d = t.allocate(100.0, apps, c, free, random.Random(seed))
    check_decision(d, apps, free)  # no GPU twice, none beyond demand_max
    granted = sum(len(g.gpus) for g in d.grants)
    assert granted == min(len(free), sum(a.unmet for a in apps)), "no GPU idles while an app could use it"
    assert all(g.expiry == 400.0 for g in d.grants)
    assert {g.source for g in d.grants} <= {"auction", "leftover"}


def test_admission_control() -> None:
    assert admit(4, 60, 64, None)
    assert admit(4, 60, 64, 1.0)
    assert not admit(8, 60, 64, 1.0)
    with pytest.raises(ValueError, match="positive"):
        admit(1, 0, 64, 0)


def test_unclaimed_gpus_are_auctioned_to_the_next_highest_rho_apps() -> None:
    """Bidders whose demand is met leave GPUs no PF bundle claims; they go to the next top 1−f by ρ
    (still free: a resource-available event), not at random — pseudocode line 10's L is only payments."""
    c = Cluster.build([(1, 4), (1, 4)])
    apps = [app(f"a{i}", 1000, 1, arrival=float(i)) for i in range(10)]  # all hold nothing: ρ = ρ_cap
    d = Themis(ThemisConfig(fairness_knob=0.8)).allocate(0.0, apps, c, c.gpu_ids[:6], random.Random(0))
    check_decision(d, apps, c.gpu_ids[:6])
    assert {g.app_id for g in d.grants} == {f"a{i}" for i in range(6)}  # earliest arrivals, in ρ order
    assert all(g.source == "auction" for g in d.grants)
    assert d.record["passes"] == 3  # k = ⌈0.2·N⌉ = 2, 2, 2 as N shrinks 10 → 8 → 6
    old = Themis(ThemisConfig(fairness_knob=0.8, unclaimed="leftover"))
    d_old = old.allocate(0.0, apps, c, c.gpu_ids[:6], random.Random(0))
    assert sorted(g.source for g in d_old.grants) == ["auction"] * 2 + ["leftover"] * 4


def test_filter_over_active_apps_counts_satisfied_apps() -> None:
    """N of ⌈(1−f)·N⌉ is every active app (Themis §3.3.2); a satisfied app in the top k bids for nothing."""
    c = Cluster.build([(1, 4)] * 3)
    ids = c.gpu_ids
    # Five satisfied apps far behind (high ρ), five hungry apps that hold one of two GPUs.
    done = [app(f"s{i}", 1000, 1, held=(ids[i],), arrival=-1e5, remaining=1e6) for i in range(5)]
    hungry = [app(f"h{i}", 100, 2, held=(ids[5 + i],), arrival=-10.0 - i) for i in range(5)]
    apps = done + hungry
    free = ids[10:]
    active = Themis(ThemisConfig(fairness_knob=0.8, filter_over="active"))
    d = active.allocate(0.0, apps, c, free, random.Random(0))
    assert d.record["participants"] == [] and d.record["passes"] == 3  # nobody, then k = 1, 1
    assert d.record["active"] == 10
    by_rho = Themis(ThemisConfig(fairness_knob=0.8, filter_over="hungry")).allocate(
        0.0, apps, c, free, random.Random(0)
    )
    assert by_rho.record["active"] == 5 and len(by_rho.record["participants"]) == 1
    for dec in (d, by_rho):
        check_decision(dec, apps, free)
        assert sum(len(g.gpus) for g in dec.grants) == 2  # work-conserving either way


def test_new_knobs_are_validated() -> None:
    with pytest.raises(ValueError, match="filter_over"):
        ThemisConfig(filter_over="all")
    with pytest.raises(ValueError, match="unclaimed"):
        ThemisConfig(unclaimed="drop")
    with pytest.raises(ValueError, match="starving_rank"):
        ThemisConfig(starving_rank="fifo")


def test_fair_share_rank_of_an_app_holding_nothing_starts_at_one_and_grows_with_waiting() -> None:
    """`starving_rank: fair_share`: (elapsed + time on a 1/N_avg share) / T_id, with T_id = T_cluster·N_avg."""
    c = Cluster.build([(1, 4), (1, 4)])  # R_C = 8
    t = Themis()
    assert t.config.starving_rank == "fair_share"
    newcomer = app("new", 800.0, 8, arrival=0.0, n_avg=4.0)  # T_id = 800/8 · 4 = 400; share 2 GPUs → 400 s
    assert t.current_rho(newcomer, 0.0, c) == t.config.rho_cap  # its bid still values nothing at ∞
    assert t.rank_rho(newcomer, 0.0, c) == pytest.approx(1.0)
    assert t.rank_rho(newcomer, 200.0, c) == pytest.approx(1.5)  # waited half its T_id
    small = app("small", 100.0, 1, arrival=0.0, n_avg=4.0)  # share capped at its demand: 100 s; T_id 400 s
    assert t.rank_rho(small, 0.0, c) == pytest.approx(0.25)
    assert Themis(ThemisConfig(starving_rank="cap")).rank_rho(newcomer, 0.0, c) == t.config.rho_cap
    # The auction record reports the bid's ρ_current (ρ_cap for an empty holding), not the filter rank.
    d = t.allocate(0.0, [newcomer], c, c.gpu_ids, random.Random(0))
    assert d.record["participants"][0]["rho_current"] == t.config.rho_cap


def test_fair_share_rank_lets_a_starved_holder_outbid_a_newcomer() -> None:
    """Under contention the most unfairly treated app bids, not whoever holds nothing: an app that has
    held one GPU of its 4 for a while (ρ 1.3) is filtered in before a newcomer (rank 0.4), though the
    newcomer holds nothing; `starving_rank: cap` seats the newcomer."""
    c = Cluster.build([(1, 4), (1, 4)])
    ids = c.gpu_ids
    busy = [
        app(f"b{i}", 400.0, 2, held=tuple(ids[2 * i : 2 * i + 2]), arrival=0.0, n_avg=5.0) for i in range(3)
    ]
    sliver = app("sliver", 1600.0, 4, held=(ids[6],), arrival=0.0, n_avg=5.0)  # 1 of 4 GPUs for 1000 s
    newcomer = app("new", 1600.0, 4, arrival=1000.0, n_avg=5.0)
    apps = [*busy, sliver, newcomer]
    t = Themis(ThemisConfig(fairness_knob=0.8))  # 5 active apps → 1 bidder
    assert t.rank_rho(sliver, 1000.0, c) > t.rank_rho(newcomer, 1000.0, c)
    d = t.allocate(1000.0, apps, c, [ids[7]], random.Random(0))
    assert d.record["participants"][0]["app"] == "sliver"
    assert d.granted().get("sliver") == [ids[7]]
    lit = Themis(ThemisConfig(fairness_knob=0.8, starving_rank="cap")).allocate(
        1000.0, apps, c, [ids[7]], random.Random(0)
    )
    assert lit.record["participants"][0]["app"] == "new"
