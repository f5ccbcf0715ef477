"""Orloj batch-decision time vs queue length (target ≤ 1 ms at 10,000 queued; Orloj §5).

Run: .venv/bin/python tests/bench/bench_orloj.py
Baseline column: the same decision with an O(n log n) full re-sort of Eq. 2 scores (the naive approach
the paper's convex hull avoids)."""

from __future__ import annotations

import time

import numpy as np
from tessera.policy.serving.common import BatchLatencyModel, Request
from tessera.policy.serving.orloj import OrlojConfig, OrlojScheduler, scores_by_slack
from tessera.progress import Progress

SIZES = (10, 100, 1_000, 10_000, 100_000)


def _fill(n: int) -> OrlojScheduler:
    rng = np.random.default_rng(0)
    pri = {"a": rng.normal(0.05, 0.005, 500).tolist(), "b": rng.normal(0.1, 0.005, 500).tolist()}
    s = OrlojScheduler(OrlojConfig(latency=BatchLatencyModel(s0=0.8, s1=0.2)), pri)
    for i, d in enumerate(rng.uniform(2.0, 60.0, n)):
        s.enqueue(Request(i, "m", 0.0, float(d), "a", 0.05), 0.0)
    return s


def main() -> None:
    rows = []
    with Progress(len(SIZES), "bench_orloj", enabled=True) as p:
        for k, n in enumerate(SIZES):
            s = _fill(n)
            reps = 50
            t0 = time.perf_counter()
            for r in range(reps):
                b = s.next_batch(0.001 * r, 0)
                assert b is not None
                for q in b.requests:  # keep the queue at size n
                    s.enqueue(Request(q.rid + 10_000_000 * (r + 1), "m", 0.0, q.deadline, q.app, 0.05), 0.0)
            ours = (time.perf_counter() - t0) / reps
            t0 = time.perf_counter()
            s._flush()
            for _ in range(reps):
                order = np.argsort(-scores_by_slack(s.tables[16], s._dl))[:16]
                del order
            naive = (time.perf_counter() - t0) / reps
            rows.append((n, ours * 1e3, naive * 1e3))
            p.update(k + 1)
    print(f"{'queued':>8} {'decision ms':>12} {'re-sort ms':>11} {'ratio':>6} {'growth':>7}")
    for i, (n, o, nv) in enumerate(rows):
        g = "" if i == 0 else f"{o / rows[i - 1][1]:.2f}x"
        print(f"{n:>8} {o:>12.3f} {nv:>11.3f} {o / nv:>6.2f} {g:>7}")
    ok = dict((n, o) for n, o, _ in rows)[10_000] <= 1.0
    print(f"target <= 1 ms at 10,000 queued: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
