"""The decision scores only a window of the queue (slack up to the largest bin edge, plus the batch
size); it must pick exactly what a full Eq. 2 ranking of the whole queue picks."""

from __future__ import annotations

import numpy as np
from tessera.policy.serving.common import BatchLatencyModel, Request
from tessera.policy.serving.orloj import OrlojConfig, OrlojScheduler


def test_windowed_pick_equals_full_ranking() -> None:
    rng = np.random.default_rng(4)
    pri = {"a": rng.normal(0.05, 0.005, 300).tolist(), "b": rng.normal(0.1, 0.005, 300).tolist()}
    s = OrlojScheduler(OrlojConfig(latency=BatchLatencyModel(s0=0.8, s1=0.2)), pri)
    # Deadlines on a coarse grid so equal deadlines (ties) occur, spread far past the largest bin edge.
    for i, d in enumerate(np.round(rng.uniform(0.2, 5.0, 3000), 2)):
        s.enqueue(Request(i, "m", 0.0, float(d), "a" if i % 2 else "b", 0.05), 0.0)
    for step in range(20):
        now = 0.01 * step
        s._drop_phase(now)
        bs = s.choose_batch_size(now)
        assert bs is not None
        ids, sc = s.scores(bs, now)  # the whole Q_bs, in (deadline, arrival) order
        order = sorted(range(sc.size), key=lambda k: (-sc[k], k))[:bs]
        want = sorted(int(ids[k]) for k in order)
        got = s.next_batch(now, 0)
        assert got is not None and sorted(r.rid for r in got.requests) == want
