"""Pods a controller has just created count as present until its watch lists them (no duplicate creates)."""

from tessera.controller.sync import RecentCreates


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_created_pods_stay_expected_until_listed_or_expired() -> None:
    clock = _Clock()
    recent = RecentCreates(ttl_s=30.0, clock=clock)
    recent.add("ns", ["a-0", "a-1"])
    recent.add("other", ["a-0"])
    assert recent.pending("ns", set()) == {"a-0", "a-1"}
    assert recent.pending("ns", {"a-0"}) == {"a-1"}  # the watch lists a-0: forgotten
    assert recent.pending("ns", set()) == {"a-1"}
    clock.t = 31.0  # never listed (deleted before the watch saw it): created again after the TTL
    assert recent.pending("ns", set()) == set()
    assert recent.pending("other", set()) == set()


def test_a_failed_create_is_not_expected() -> None:
    recent = RecentCreates()
    recent.add("ns", ["a-0", "a-1"])
    recent.discard("ns", ["a-1"])
    assert recent.pending("ns", set()) == {"a-0"}


def test_pending_among_planned_names_only() -> None:
    clock = _Clock()
    recent = RecentCreates(ttl_s=30.0, clock=clock)
    recent.add("ns", ["a-0", "b-0", "b-1"])
    assert recent.pending("ns", set(), among=["b-0", "b-1", "c-0"]) == {"b-0", "b-1"}
    assert recent.pending("ns", {"b-0"}, among=["b-0", "b-1"]) == {"b-1"}  # listed: forgotten
    assert recent.pending("ns", set()) == {"a-0", "b-1"}


def test_entries_nobody_asks_about_expire_on_a_later_add() -> None:
    clock = _Clock()
    recent = RecentCreates(ttl_s=30.0, clock=clock)
    recent.add("ns", [f"old-{i}" for i in range(100)])
    clock.t = 31.0
    recent.add("ns", ["new-0"])
    assert len(recent._since) == 1
