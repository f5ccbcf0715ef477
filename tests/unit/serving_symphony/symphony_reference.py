"""Reference copy of Symphony's Algorithm 1 scheduler as it was before the throughput work (commit
8da72e3, ``operator/tessera/policy/serving/symphony/scheduler.py``), kept verbatim apart from this docstring
and the removed ``autoscale_advice``. Used only by ``test_equivalence.py``, which checks that the optimised
scheduler makes exactly the same decisions (batches, GPUs, start times, drops, timers); the benchmark
``tests/bench/bench_symphony.py`` times it side by side as the "before" column. Not for production use.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tessera.policy.serving.common import Batch, Drop, DropReason, LinearProfile, Request


@dataclass
class Candidate:
    size: int
    exec: float
    latest: float
    version: int


class ReferenceSymphonyScheduler:
    """Algorithm 1 for a shard of models over ``n_gpus`` GPUs (ids 0..n−1).

    Drive it with ``enqueue(request, now)`` and ``advance(now)``, which fires every timer due by
    ``now`` and returns the batches dispatched (``Batch.worker`` is the GPU, ``Batch.start`` its exec
    time); ``next_timer()`` says when to call ``advance`` next. ``timeout`` None = deferred (Symphony);
    a number k = timeout batching inside the same framework, 0 = eager.
    """

    def __init__(
        self,
        profiles: Mapping[str, LinearProfile],
        n_gpus: int,
        *,
        timeout: float | None = None,
        refresh_stale: bool = True,
    ) -> None:
        if n_gpus < 1:
            raise ValueError(f"Symphony needs at least one GPU, got {n_gpus}")
        if not profiles:
            raise ValueError("Symphony needs at least one model profile")
        self.profiles = dict(profiles)
        self.timeout = timeout
        self.refresh_stale = refresh_stale
        self.gpu_free = [-math.inf] * n_gpus
        self._queues: dict[str, list[tuple[float, int, Request]]] = {m: [] for m in profiles}
        self._cand: dict[str, Candidate | None] = dict.fromkeys(profiles)
        self._timers: list[tuple[float, int, str, str | int, int]] = []
        self._seq = itertools.count()
        self._ver = itertools.count()
        self._gpu_ver = [0] * n_gpus
        self._busy: list[tuple[float, int]] = []  # (free time, gpu), lazily validated
        self._idle: list[int] = list(range(n_gpus))  # gpu ids free as of the last model timer
        self._in_idle = [True] * n_gpus
        self._drops: list[Drop] = []
        self._out: list[Batch] = []

    # -- Algorithm 1 ---------------------------------------------------------------------------
    def _get_batch(self, m: str, now: float) -> int:
        prof, q = self.profiles[m], self._queues[m]
        k = 0
        while k < len(q) and q[k][0] - prof(1) < now:  # same arithmetic as `latest`, so latest ≥ now
            self._drops.append(Drop(q[k][2], now, DropReason.CANNOT_MEET_DEADLINE))
            k += 1
        if k:
            del q[:k]
        if not q:
            return 0
        d = q[0][0]
        n = 1
        cap = min(len(q), prof.max_batch)
        while n < cap and d - prof(n + 1) >= now:
            n += 1
        return n

    def _update_candidate(self, m: str, now: float) -> None:
        n = self._get_batch(m, now)
        if n == 0:
            self._cand[m] = None
            return
        prof, q = self.profiles[m], self._queues[m]
        d = q[0][0]
        if self.timeout is None:
            ex = max(now, d - prof(n + 1))
        else:
            ex = max(now, min(e[2].arrival for e in q[:n]) + self.timeout)
        c = Candidate(n, ex, d - prof(n), next(self._ver))
        self._cand[m] = c
        heapq.heappush(self._timers, (ex, next(self._seq), "model", m, c.version))
        if self.refresh_stale:
            heapq.heappush(
                self._timers, (math.nextafter(c.latest, math.inf), next(self._seq), "stale", m, c.version)
            )

    def _dispatch(self, m: str, g: int, now: float) -> None:
        self._update_candidate(m, now)
        c = self._cand[m]
        if c is None:
            return
        q = self._queues[m]
        reqs = [e[2] for e in q[: c.size]]
        del q[: c.size]
        dur = self.profiles[m](c.size)
        self.gpu_free[g] = c.exec + dur
        self._gpu_ver[g] += 1
        heapq.heappush(self._busy, (self.gpu_free[g], g))
        heapq.heappush(self._timers, (self.gpu_free[g], next(self._seq), "gpu", g, self._gpu_ver[g]))
        self._out.append(Batch(reqs, g, c.exec, dur, m))
        self._update_candidate(m, now)

    def enqueue(self, request: Request, now: float) -> None:
        q = self._queues.get(request.model)
        if q is None:
            raise ValueError(
                f"request {request.rid} is for model {request.model!r}, not served by this shard"
            )
        bisect.insort(q, (request.deadline, request.rid, request), key=lambda e: (e[0], e[1]))
        self._update_candidate(request.model, now)

    def _on_model_timer(self, m: str, now: float) -> None:
        c = self._cand[m]
        if c is None:
            return
        g = self._lowest_free(c.exec)
        if g is not None:
            self._dispatch(m, g, now)

    def _lowest_free(self, t: float) -> int | None:
        """argmin id over GPUs with ``free ≤ t`` (line 19). Model timers fire in time order, so a GPU
        moved to the idle heap stays free until it is dispatched again (which re-enters it as busy)."""
        busy, idle, gf = self._busy, self._idle, self.gpu_free
        while busy and busy[0][0] <= t:
            f, g = heapq.heappop(busy)
            if gf[g] == f and not self._in_idle[g]:
                self._in_idle[g] = True
                heapq.heappush(idle, g)
        while idle:
            g = idle[0]
            if gf[g] <= t:
                return g
            heapq.heappop(idle)  # dispatched by its GPU timer meanwhile; its busy entry re-adds it
            self._in_idle[g] = False
        return None

    def _on_gpu_timer(self, g: int, now: float) -> None:
        f = self.gpu_free[g]
        best: tuple[float, str] | None = None
        for m, c in self._cand.items():
            if c is not None and c.exec <= f <= c.latest and (best is None or (c.latest, m) < best):
                best = (c.latest, m)
        if best is not None:
            self._dispatch(best[1], g, now)

    def next_timer(self) -> float | None:
        while self._timers and not self._live(self._timers[0]):
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _live(self, e: tuple[float, int, str, str | int, int]) -> bool:
        _, _, kind, key, ver = e
        if kind == "gpu":
            return self._gpu_ver[int(key)] == ver
        c = self._cand[str(key)]
        return c is not None and c.version == ver

    def advance(self, now: float, *, strictly_before: bool = False) -> list[Batch]:
        """Fire the timers due at or before ``now`` (before it, if ``strictly_before``)."""
        while self._timers and (
            self._timers[0][0] < now or (not strictly_before and self._timers[0][0] <= now)
        ):
            e = heapq.heappop(self._timers)
            if not self._live(e):
                continue
            t, _, kind, key, _ = e
            if kind == "model":
                self._on_model_timer(str(key), t)
            elif kind == "gpu":
                self._on_gpu_timer(int(key), t)
            else:
                self._update_candidate(str(key), t)
        out, self._out = self._out, []
        return out

    def take_drops(self) -> list[Drop]:
        out, self._drops = self._drops, []
        return out

    def take_cancelled(self) -> list[tuple[Batch, float]]:
        """Symphony never cancels a dispatched batch (interface parity with the baselines)."""
        return []
