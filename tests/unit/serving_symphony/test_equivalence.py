"""The optimised Symphony scheduler decides exactly as the pre-optimisation one (``symphony_reference.py``,
a verbatim copy of the old code): same batches (model, GPU, start, expected latency, members in order),
same drops (request, time, reason) and same next timer after every call, on seeded random traces.

The traces mix models with different profiles (non-monotone measured tables, small ``max_batch``),
per-request SLO jitter (out-of-order deadlines), duplicate request ids, times on a coarse grid (exact
timer ties between models and GPUs), overload (drops) and light load, for deferred, eager, timeout
batching and with the stale refresh off, plus a switch to eager mid-run as in the §3.3 trace T3."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from tessera.policy.serving.common import LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler

from .symphony_reference import ReferenceSymphonyScheduler


def _profiles(rng: random.Random, n_models: int, grid: bool) -> dict[str, LinearProfile]:
    """Random profiles; on a grid every latency is a multiple of 0.25, so timer ties are exact."""
    out: dict[str, LinearProfile] = {}
    for k in range(n_models):
        alpha = rng.choice([0.0, 0.25, 0.5, 1.0] if grid else [0.0, 0.5, rng.uniform(0.1, 2.0)])
        beta = rng.choice([2.0, 5.0] if grid else [2.0, rng.uniform(1.0, 10.0)])
        max_batch = rng.choice([1, 3, 8, 512])
        table: dict[int, float] = {}
        if rng.random() < 0.4:  # measured points, deliberately not monotone
            for b in rng.sample(range(1, 12), 4):
                v = alpha * b + beta + rng.uniform(-2.0, 2.0) * max(alpha, 0.5)
                table[b] = max(0.25, round(v * 4) / 4) if grid else v
        out[f"m{rng.randrange(100)}-{k}"] = LinearProfile(alpha, beta, max_batch, table)
    return out


def _requests(rng: random.Random, profiles: dict[str, LinearProfile], n: int, grid: bool) -> list[Request]:
    names = sorted(profiles)
    slo = {m: rng.uniform(2.0, 4.0) * profiles[m](min(8, profiles[m].max_batch)) for m in names}
    gap = rng.choice([0.05, 0.2, 0.5, 1.5])
    reqs: list[Request] = []
    t = 0.0
    for i in range(n):
        t += rng.choice([0.0, 0.25, 0.5, 0.75]) if grid else rng.expovariate(1 / gap)
        m = rng.choice(names)
        s = slo[m] if rng.random() < 0.7 else slo[m] * rng.uniform(0.3, 1.5)
        if grid:
            s = round(s * 4) / 4
        rid = i if rng.random() < 0.95 else max(0, i - 1)  # a few duplicate ids
        reqs.append(Request(rid, m, t, t + s))
    return reqs


def _trace(s: Any, reqs: list[Request], switch_eager_at: float | None) -> list[tuple[Any, ...]]:
    """Drive a scheduler as the cluster simulator does; log every decision and the next timer."""
    log: list[tuple[Any, ...]] = []

    def step(batches: list[Any]) -> None:
        for b in batches:
            log.append(("batch", b.model, b.worker, b.start, b.expected_latency, [r.rid for r in b.requests]))
        for d in s.take_drops():
            log.append(("drop", d.request.rid, d.time, d.reason))
        log.append(("next", s.next_timer()))

    i = 0
    while True:
        ta = reqs[i].arrival if i < len(reqs) else math.inf
        nt = s.next_timer()
        tt = math.inf if nt is None else nt
        if ta == math.inf and tt == math.inf:
            break
        if tt < ta:
            step(s.advance(tt))
            continue
        step(s.advance(ta, strictly_before=True))
        if switch_eager_at is not None and ta >= switch_eager_at:
            s.timeout = 0.0
        s.enqueue(reqs[i], ta)
        i += 1
        step(s.advance(ta))
    log.append(("free", list(s.gpu_free)))
    return log


MODES: list[dict[str, Any]] = [
    {},
    {"timeout": 0.0},
    {"timeout": 1.5},
    {"refresh_stale": False},
]


@pytest.mark.parametrize("seed", range(24))
def test_same_decisions_as_reference_on_random_traces(seed: int) -> None:
    rng = random.Random(seed)
    profiles = _profiles(rng, rng.randint(1, 6), seed % 3 == 0)
    n_gpus = rng.choice([1, 2, 3, 8])
    reqs = _requests(rng, profiles, 600, grid=seed % 3 == 0)
    mode = MODES[seed % len(MODES)]
    switch = reqs[len(reqs) // 2].arrival if seed % 5 == 4 else None
    ref = _trace(ReferenceSymphonyScheduler(profiles, n_gpus, **mode), reqs, switch)
    new = _trace(SymphonyScheduler(profiles, n_gpus, **mode), reqs, switch)
    assert len(new) == len(ref)
    for k, (a, b) in enumerate(zip(ref, new, strict=True)):
        assert a == b, f"step {k}: reference {a} != optimised {b}"


def test_random_traces_exercise_drops_ties_and_large_batches() -> None:
    """Guards the test above against vacuous traces: across the seeds there must be drops, batches of
    several sizes and timers due at the same instant (grid traces)."""
    drops = sizes = ties = 0
    seen_sizes: set[int] = set()
    for seed in range(24):
        rng = random.Random(seed)
        profiles = _profiles(rng, rng.randint(1, 6), seed % 3 == 0)
        n_gpus = rng.choice([1, 2, 3, 8])
        reqs = _requests(rng, profiles, 600, grid=seed % 3 == 0)
        log = _trace(SymphonyScheduler(profiles, n_gpus, **MODES[seed % len(MODES)]), reqs, None)
        drops += sum(e[0] == "drop" for e in log)
        starts = [e[3] for e in log if e[0] == "batch"]
        ties += len(starts) - len(set(starts))
        seen_sizes |= {len(e[5]) for e in log if e[0] == "batch"}
    sizes = len(seen_sizes)
    assert drops > 100 and ties > 10 and sizes >= 8, (drops, ties, sizes)


def test_non_monotone_table_batch_size_matches_head_greedy_loop() -> None:
    # ℓ = 5, 9, 6, 7 for b = 1..4 (b = 2 measured slow): with d − now = 8, the head-greedy loop stops at
    # b = 1 because ℓ(2) = 9 > 8, even though ℓ(3) = 6 would fit.
    prof = LinearProfile(1.0, 3.0, 4, {1: 5.0, 2: 9.0, 3: 6.0, 4: 7.0})
    s = SymphonyScheduler({"m": prof}, 1)
    for rid in range(3):
        s.enqueue(Request(rid, "m", 0.0, 8.0), 0.0)
    c = s.candidate("m")
    assert c is not None and c.size == 1 and c.latest == 3.0 and c.exec == 0.0
    ref = ReferenceSymphonyScheduler({"m": prof}, 1)
    for rid in range(3):
        ref.enqueue(Request(rid, "m", 0.0, 8.0), 0.0)
    assert [b.size for b in s.advance(0.0)] == [b.size for b in ref.advance(0.0)] == [1]


def test_unknown_model_is_rejected() -> None:
    s = SymphonyScheduler({"m": LinearProfile(1.0, 5.0)}, 2)
    with pytest.raises(ValueError, match="not served by this shard"):
        s.enqueue(Request(0, "x", 0.0, 10.0), 0.0)
    with pytest.raises(ValueError, match="not served by this shard"):
        s.candidate("x")
    with pytest.raises(ValueError, match="at least one GPU"):
        SymphonyScheduler({"m": LinearProfile(1.0, 5.0)}, 0)
