"""Symphony's §3.3 worked traces and formula checks (§3.1)."""

from tessera.policy.serving.common import Batch, LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler, autoscale_advice

PROF = LinearProfile(alpha=1.0, beta=5.0)


def _run(n: int, skip: set[int], switch_eager_at: float | None = None) -> tuple[list[Batch], list[int]]:
    s = SymphonyScheduler({"m": PROF}, 3)
    batches: list[Batch] = []
    drops: list[int] = []
    for i in range(1, n + 1):
        t = 0.75 * (i - 1)
        batches += s.advance(t, strictly_before=True)
        if switch_eager_at is not None and t >= switch_eager_at and s.timeout is None:
            s.timeout = 0.0
        if i not in skip:
            s.enqueue(Request(i, "m", t, t + 12.0), t)
        batches += s.advance(t)
        drops += [d.request.rid for d in s.take_drops()]
    batches += s.advance(1e9)
    drops += [d.request.rid for d in s.take_drops()]
    return batches, drops


def test_t1_deferred_staggered_no_drops() -> None:
    batches, drops = _run(40, set())
    assert drops == []
    got = [(b.start, [r.rid for r in b.requests], b.worker) for b in batches[:4]]
    assert got == [
        (2.25, [1, 2, 3, 4], 0),
        (5.25, [5, 6, 7, 8], 1),
        (8.25, [9, 10, 11, 12], 2),
        (11.25, [13, 14, 15, 16], 0),
    ]
    assert all(b.size == 4 for b in batches)
    for b in batches:  # never late
        assert b.start + PROF(b.size) <= min(r.deadline for r in b.requests)


def test_t2_pattern_regained() -> None:
    batches, drops = _run(40, {13, 14, 15})
    assert drops == []
    assert [(b.start, b.size) for b in batches[3:6]] == [(13.5, 4), (16.5, 4), (19.5, 4)]
    assert [r.rid for r in batches[3].requests] == [16, 17, 18, 19]


def test_t3_eager_drops_r35_r37_r38() -> None:
    batches, drops = _run(50, {13, 14, 15}, switch_eager_at=11.25)
    after = [(b.start, b.size) for b in batches if b.start >= 11.25]
    assert after[:5] == [(11.25, 1), (14.25, 4), (17.25, 4), (18.0, 1), (23.25, 2)]
    assert drops[:3] == [35, 37, 38]


def test_formulas() -> None:
    assert 12 - PROF(5) == 2 and 12 - PROF(4) == 3
    assert autoscale_advice(24, 0.2, 0.0) == 6
    assert autoscale_advice(24, 0.0, 0.25) == -6
