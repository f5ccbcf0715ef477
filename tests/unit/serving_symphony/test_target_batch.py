"""The early-drop GETBATCH's target batch size (spec A.5): the authors' BatchSizeEstimator over the model's own
metered rate (``modelRate``, the default) and the rule over every GPU of the shard (``clusterGpus``)."""

from __future__ import annotations

import pytest
from tessera.policy.serving.common import LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler

PROF = LinearProfile(0.001, 0.005)  # ℓ(b) = b + 5 ms
SLO = 0.030


def _sched(rule: str, n_gpus: int = 1) -> SymphonyScheduler:
    return SymphonyScheduler({"m": PROF}, n_gpus, get_batch="earlyDropForTarget", target_batch=rule)


def _feed(s: SymphonyScheduler, times: list[float]) -> None:
    for rid, t in enumerate(times):
        s.advance(t, strictly_before=True)
        s.enqueue(Request(rid, "m", t, t + SLO, "m", PROF(1)), t)
        s.advance(t)


def test_before_any_rate_the_target_is_the_nexus_rule() -> None:
    # GetMaxBatchWithFullBudget(SLO / 2): the largest b with ℓ(b) ≤ 15 ms.
    assert _sched("modelRate").target_for("m", SLO, 0.0) == 10


def test_steady_rate_gives_the_batch_that_fills_in_time() -> None:
    # 500 req/s, evenly spaced: every 50 ms bin holds 25 hits, r = 500 + 2·0. n(b) = r·ℓ(b)/b and
    # ℓ(b)·(1 + 1/n) = ℓ(b) + b/r ≤ 30 ms: 3b + 5 ≤ 30 → b = 8.
    s = _sched("modelRate")
    _feed(s, [0.002 * k for k in range(500)])
    assert s.target_for("m", SLO, 1.0) == 8
    # The cluster rule ignores the rate: (1 + 1/1)·ℓ(b) ≤ 30 ms on 1 GPU → b = 10; on 4 GPUs 1.25·ℓ(b) → 19.
    c = _sched("clusterGpus")
    _feed(c, [0.002 * k for k in range(500)])
    assert c.target_for("m", SLO, 1.0) == 10
    assert _sched("clusterGpus", 4).target_for("m", SLO, 0.0) == 19
    assert s.target_batch == "modelRate" and c.target_batch == "clusterGpus"


def test_rate_is_mean_plus_two_std_of_the_bins() -> None:
    # 4 hits in even bins, none in odd ones: mean 40 req/s, std 40 → r = 120; ℓ(b) + b/120 ≤ 30 ms:
    # 0.001b + 0.005 + b/120 ≤ 0.03 → b ≤ 2.68 → 2. Without the std term r = 40 would give 1.
    s = _sched("modelRate")
    times = [0.1 * k + 0.01 * j for k in range(20) for j in range(4)]
    _feed(s, times)
    assert s.target_for("m", SLO, 2.0) == 2


def test_window_forgets_after_100_bins_and_zero_rate_gives_one() -> None:
    s = _sched("modelRate")
    _feed(s, [0.002 * k for k in range(500)])
    # 100 empty bins later the window holds only zeros: n = 0, 1 + 1/n is infinite, the estimator returns 1.
    assert s.target_for("m", SLO, 1.0 + 100 * 0.05 + 0.01) == 1


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="target_batch"):
        SymphonyScheduler({"m": PROF}, 1, target_batch="nope")
