"""Orloj Algorithm 1 against a hand-worked trace, plus invariants and online learning."""

import numpy as np
import pytest
from tessera.policy.serving.common import BatchLatencyModel, BatchTimings, DropReason, Request
from tessera.policy.serving.orloj import CandidateOrder, CountHistogram, OrlojConfig, OrlojScheduler


def _sched(order: CandidateOrder, b: float = 1e-4) -> OrlojScheduler:
    cfg = OrlojConfig(
        batch_sizes=(1, 2, 4), latency=BatchLatencyModel.eq3(2.0, 0.5), b=b, candidate_order=order
    )
    s = OrlojScheduler(cfg, {"a": CountHistogram.from_samples([10.0, 30.0], 1.0)})
    for i, d in enumerate((20, 50, 70, 80, 90), 1):
        s.enqueue(Request(i, "m", 0.0, float(d), "a", 30.0), 0.0)
    return s


def test_expected_batch_latencies() -> None:
    s = _sched(CandidateOrder.LITERAL_DESC)
    assert s.estimate == pytest.approx({1: 12.25, 2: 27.5, 4: 60.5})


@pytest.mark.parametrize("b", [1e-4, 0.01])
def test_literal_desc_trace(b: float) -> None:
    s = _sched(CandidateOrder.LITERAL_DESC, b)
    batch = s.next_batch(0.0, 0)
    assert batch is not None and [r.rid for r in batch.requests] == [2, 3]
    assert s.take_drops() == []
    assert s.next_batch(17.0, 0) is not None
    drops = s.take_drops()
    assert [(d.request.rid, d.reason) for d in drops] == [(1, DropReason.CANNOT_MEET_DEADLINE)]


@pytest.mark.parametrize("b", [1e-4, 0.01])
def test_edf_then_largest_trace(b: float) -> None:
    s = _sched(CandidateOrder.EDF_THEN_LARGEST, b)
    first = s.next_batch(0.0, 0)
    assert first is not None and [r.rid for r in first.requests] == [1]
    second = s.next_batch(17.0, 0)
    assert second is not None and [r.rid for r in second.requests] == [2, 3]
    assert s.take_drops() == []


def test_scores_in_q2_at_b_001() -> None:
    s = _sched(CandidateOrder.LITERAL_DESC, 0.01)
    s._drop_phase(0.0)
    ids, sc = s.scores(2, 0.0)
    assert list(ids) == [2, 3, 4, 5]
    assert sc * 1e3 == pytest.approx([29.1, 23.9, 21.6, 19.5], abs=0.05)


def test_random_trace_invariants() -> None:
    rng = np.random.default_rng(5)
    cfg = OrlojConfig(latency=BatchLatencyModel(s0=0.8, s1=0.2), b=0.1)
    priors = {"a": rng.normal(0.05, 0.005, 300).clip(0.01), "b": rng.normal(0.1, 0.005, 300).clip(0.01)}
    s = OrlojScheduler(cfg, priors)
    arrivals = np.cumsum(rng.exponential(0.01, 600))
    seen: set[int] = set()
    t = 0.0
    i = 0
    outcomes = 0
    while i < len(arrivals) or s.queue_length:
        while i < len(arrivals) and arrivals[i] <= t:
            app = "a" if rng.random() < 0.5 else "b"
            solo = float(priors[app][i % 300])
            s.enqueue(Request(i, "m", arrivals[i], arrivals[i] + 0.3, app, solo), t)
            i += 1
        batch = s.next_batch(t, 0)
        for d in s.take_drops():
            assert d.request.rid not in seen
            seen.add(d.request.rid)
            outcomes += 1
        if batch is None:
            if i >= len(arrivals):
                break
            t = float(arrivals[i])
            continue
        assert batch.size in cfg.batch_sizes
        for r in batch.requests:
            assert r.rid not in seen
            seen.add(r.rid)
            outcomes += 1
        dur = cfg.latency.batch_time([r.solo_time for r in batch.requests])
        s.on_complete(
            batch, BatchTimings(t, t + dur, {batch.requests[0].rid: batch.requests[0].solo_time}), t + dur
        )
        t += dur
    assert outcomes == len(arrivals) == len(seen)


def test_online_learning_shifts_estimates() -> None:
    cfg = OrlojConfig(
        batch_sizes=(1, 2),
        latency=BatchLatencyModel(s0=1.0, s1=0.0),
        bin_width=1.0,
        min_samples=50,
        pickup_interval=0.0,
    )
    s = OrlojScheduler(cfg, {"a": [10.0] * 100})
    assert s.estimate[1] == pytest.approx(10.5)
    for i in range(100):
        r = Request(i, "m", 0.0, 1e9, "a", 40.0)
        s.enqueue(r, 0.0)
        batch = s.next_batch(0.0, 0)
        assert batch is not None
        s.on_complete(batch, BatchTimings(0.0, 1.0, {rb.rid: 40.0 for rb in batch.requests}), 1.0)
    s.enqueue(Request(10_000, "m", 0.0, 1e9, "a", 40.0), 1.0)
    s.next_batch(1.0, 0)
    assert s.estimate[1] == pytest.approx(40.5)


def test_bad_config_errors() -> None:
    with pytest.raises(ValueError, match="include 1"):
        OrlojConfig(batch_sizes=(2, 4))
    with pytest.raises(ValueError, match="drop_estimator"):
        OrlojConfig(drop_estimator="median")
    with pytest.raises(ValueError, match="prior"):
        OrlojScheduler(OrlojConfig(), {})
