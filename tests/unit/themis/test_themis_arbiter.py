"""The arbiter round: filter (spec §6.5), leftover work conservation and leases (§6.6)."""

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
    c = Cluster.build([(1, 4), (1, 4)])
    held = c.gpu_ids[:7]
    apps = [app(f"r{i}", 1000, 2, held=tuple(held[i * 2 : i * 2 + 2]), arrival=-500) for i in range(3)]
    apps.append(app("r3", 1000, 2, held=(held[6],), arrival=-500))
    apps.append(app("starved", 1000, 2, arrival=-10))  # holds nothing → ρ = ρ_cap
    t = Themis(ThemisConfig(fairness_knob=0.8))
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
