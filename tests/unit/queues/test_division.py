"""The division against examples worked by hand (each comment shows the arithmetic)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tessera.policy.queues import DivisionError, QueueNode, divide, headroom, own_share, quantize, water_fill

BIG = 1000.0


def approx(d: dict[str, float]) -> dict[str, object]:
    return {k: pytest.approx(v) for k, v in d.items()}


def test_guarantees_first_then_equal_weights_split_the_rest() -> None:
    # 10 GPUs; A g=4, B g=2, both hungry: 4 + 2 first, the other 4 split 2/2 → A 6, B 4.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b", guaranteed=2)]
    assert divide(10, qs, {"a": BIG, "b": BIG}) == approx({"a": 6, "b": 4})


def test_weights_share_what_is_left_over() -> None:
    # 12 GPUs, no guarantees, weights 3:1 → 9 and 3.
    qs = [QueueNode("a", weight=3), QueueNode("b", weight=1)]
    assert divide(12, qs, {"a": BIG, "b": BIG}) == approx({"a": 9, "b": 3})


def test_demand_caps_a_share_and_the_rest_goes_to_the_others() -> None:
    # A is guaranteed 6 but can use 2: it gets 2, B takes the other 8.
    qs = [QueueNode("a", guaranteed=6), QueueNode("b")]
    assert divide(10, qs, {"a": 2, "b": BIG}) == approx({"a": 2, "b": 8})


def test_no_demand_no_share_even_with_a_guarantee() -> None:
    qs = [QueueNode("a", guaranteed=6), QueueNode("b")]
    assert divide(10, qs, {"b": BIG}) == approx({"a": 0, "b": 10})


def test_maximum_caps_borrowing() -> None:
    # 10 GPUs; A g=2 max=3, B g=2: 2 + 2, the rest 6 would be 3/3 but A stops at 3 → A 3, B 7.
    qs = [QueueNode("a", guaranteed=2, max=3), QueueNode("b", guaranteed=2)]
    assert divide(10, qs, {"a": BIG, "b": BIG}) == approx({"a": 3, "b": 7})


def test_guarantees_above_capacity_shrink_in_proportion() -> None:
    # 6 GPUs left (a node failed) for guarantees 6 and 3: split by guarantee 2:1 → 4 and 2.
    qs = [QueueNode("a", guaranteed=6), QueueNode("b", guaranteed=3)]
    assert divide(6, qs, {"a": BIG, "b": BIG}) == approx({"a": 4, "b": 2})


def test_two_level_hierarchy() -> None:
    # 16 GPUs. Top: P (g 8) and Q (g 4): 8 + 4, the other 4 split 2/2 → P 10, Q 6.
    # Inside P: X (g 4) hungry, Y (g 2) needs 1: X 4, Y 1, the other 5 all to X (Y is capped) → X 9, Y 1.
    qs = [
        QueueNode("p", guaranteed=8),
        QueueNode("x", guaranteed=4, parent="p"),
        QueueNode("y", guaranteed=2, parent="p"),
        QueueNode("q", guaranteed=4),
    ]
    assert divide(16, qs, {"x": BIG, "y": 1, "q": BIG}) == approx({"p": 10, "x": 9, "y": 1, "q": 6})


def test_interior_queue_own_objects_sit_beside_its_children() -> None:
    # 8 GPUs all to P; inside: X (g 2) and P's own objects (g 0, weight 1): X 2, the other 6 split 3/3.
    qs = [QueueNode("p", guaranteed=4), QueueNode("x", guaranteed=2, parent="p")]
    shares = divide(8, qs, {"p": 10, "x": 10})
    assert shares == approx({"p": 8, "x": 5})
    assert own_share(qs, shares) == approx({"p": 3, "x": 5})


def test_fractional_gpus_lanes() -> None:
    # 2.5 GPUs; A wants a quarter-GPU lane, B is hungry: A 0.25, B 2.25.
    qs = [QueueNode("a", guaranteed=0.5), QueueNode("b", guaranteed=0.5)]
    assert divide(2.5, qs, {"a": 0.25, "b": BIG}) == approx({"a": 0.25, "b": 2.25})


def test_unknown_parent_and_cycle_are_refused() -> None:
    with pytest.raises(DivisionError, match="does not exist"):
        divide(4, [QueueNode("a", parent="nope")], {})
    with pytest.raises(DivisionError, match="cycle"):
        divide(4, [QueueNode("a", parent="b"), QueueNode("b", parent="a")], {})


def test_water_fill_saturates_small_caps_first() -> None:
    # 10 among caps 1, 100, 100 with equal weights: 1, then 4.5 and 4.5.
    assert water_fill(10, {"a": 1, "b": 100, "c": 100}, dict.fromkeys("abc", 1.0)) == approx(
        {"a": 1, "b": 4.5, "c": 4.5}
    )


def test_quantize_floors_then_hands_out_the_largest_remainders_within_caps() -> None:
    # 2.5 + 2.5 + 1 = 6: floors 2, 2, 1 free one GPU; ties go by name → a.
    assert quantize({"a": 2.5, "b": 2.5, "c": 1.0}, 1.0, 6) == {"a": 3, "b": 2, "c": 1}
    # With a's maximum at 2.5 it cannot round up: b does.
    assert quantize({"a": 2.5, "b": 2.5, "c": 1.0}, 1.0, 6, caps={"a": 2.5}) == {"a": 2, "b": 3, "c": 1}
    # Tenth-GPU lanes.
    assert quantize({"a": 0.25, "b": 0.75}, 0.1, 1.0) == approx({"a": 0.3, "b": 0.7})


names = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.floats(0, 64),
    specs=st.dictionaries(
        names,
        st.tuples(
            st.floats(0, 16), st.floats(0, 64) | st.just(math.inf), st.floats(0.1, 8), st.floats(0, 64)
        ),
        min_size=1,
    ),
)
def test_invariants(capacity: float, specs: dict[str, tuple[float, float, float, float]]) -> None:
    qs = [QueueNode(n, guaranteed=g, max=max(m, g), weight=w) for n, (g, m, w, _) in specs.items()]
    demand = {n: d for n, (_, _, _, d) in specs.items()}
    shares = divide(capacity, qs, demand)
    assert sum(shares.values()) <= capacity + 1e-6
    for q in qs:
        assert shares[q.name] <= min(demand[q.name], q.max) + 1e-6
    total_cap = sum(min(demand[q.name], q.max) for q in qs)
    # Work-conserving: everything is handed out unless every queue is capped.
    assert sum(shares.values()) == pytest.approx(min(capacity, total_cap), abs=1e-6)
    # The guarantee (up to demand) holds whenever the guarantees fit the capacity.
    if sum(q.guaranteed for q in qs) <= capacity:
        for q in qs:
            assert shares[q.name] >= min(q.guaranteed, demand[q.name]) - 1e-6


def test_headroom_is_the_least_room_any_ancestors_maximum_leaves() -> None:
    qs = [
        QueueNode("org", max=10),
        QueueNode("team", parent="org", max=6),
        QueueNode("x", parent="team"),
        QueueNode("y", parent="team"),
        QueueNode("z", parent="org"),
        QueueNode("other"),
    ]
    room = headroom(qs, {"x": 5, "z": 3, "org": 1})
    # team holds 5 of its 6; org 9 of its 10 (its own object, team's 5 and z's 3).
    assert room == {"org": math.inf, "team": 1, "x": 1, "y": 1, "z": 1, "other": math.inf}
    assert headroom(qs, {"x": 2})["y"] == 4  # team's 6 less x's 2; org leaves 8
