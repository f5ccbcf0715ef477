"""Orloj's scheduler iteration, Orloj (Yu et al.) Algorithm 1, as a stateful per-model object.

Pending requests are kept sorted by deadline in numpy arrays. Because EstimateBatchLatency does not
depend on the request (§2.4.1 item 3, default E[L_B(bs)]), each queue Q_bs is exactly the suffix of
requests with D_r ≥ t + est(bs): the drop phase (lines 10-14) is a binary search, D_{Q_bs} is the first
element of the suffix, and a request is timed out when it leaves its last feasible queue. PopBatch
(line 22) takes the ``cand`` highest Eq. 2 scores in Q_cand, ties to earlier deadline then arrival.

Scores are evaluated exactly and vectorised over the queue (:func:`scores_by_slack`), which replaces
the paper's dynamic convex hull (§2.5) and its base-time resets: both exist to avoid re-sorting and
overflow, and the slack form has neither problem. The batch-size candidate order of line 16 is
configurable (§2.4.1 item 1): ``literal_desc`` (default) or ``edf_then_largest``.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tessera.policy.serving.common import (
    Batch,
    BatchLatencyModel,
    BatchTimings,
    Drop,
    DropReason,
    Request,
)
from tessera.policy.serving.orloj.batch_dist import BatchDistribution, MixMode, batch_distribution
from tessera.policy.serving.orloj.histogram import CountHistogram, OnlineHistogram
from tessera.policy.serving.orloj.score import ScoreTable, scores_by_slack

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class CandidateOrder(enum.Enum):
    LITERAL_DESC = "literal_desc"  # Alg. 4.1 line 16 as printed: (D_Q, bs) descending
    EDF_THEN_LARGEST = "edf_then_largest"  # the prose: earliest D_Q first, ties to the larger bs


@dataclass
class OrlojConfig:
    """Orloj's knobs (units: the caller's time unit, seconds in the simulator).

    ``b`` defaults to 0.1/s, the paper's 10⁻⁴/ms (Orloj §4.4). ``drop_estimator`` is ``mean``, ``min`` or
    ``quantile:q`` (§2.4.1 item 3).
    """

    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16)
    latency: BatchLatencyModel = field(default_factory=BatchLatencyModel)
    b: float = 0.1
    miss_cost: float = 1.0
    bin_width: float | None = None
    mix_mode: MixMode = MixMode.ROUND_ROBIN
    candidate_order: CandidateOrder = CandidateOrder.LITERAL_DESC
    drop_estimator: str = "mean"
    window: float = 600.0
    pickup_interval: float = 10.0
    min_samples: int = 200

    def __post_init__(self) -> None:
        sizes = sorted(set(self.batch_sizes))
        if not sizes or sizes[0] != 1:
            raise ValueError(
                f"Orloj batch sizes must include 1 (§2.4.1 item 2), got {list(self.batch_sizes)}"
            )
        self.batch_sizes = tuple(sizes)
        if not self.b > 0:
            raise ValueError(f"anticipated-delay rate b must be > 0, got {self.b!r}")
        est = self.drop_estimator
        if est not in ("mean", "min") and not est.startswith("quantile:"):
            raise ValueError(f"drop_estimator must be 'mean', 'min' or 'quantile:q', got {est!r}")


class OrlojScheduler:
    """One model's Orloj batch scheduler (interface: :class:`tessera.policy.serving.common.BatchScheduler`)."""

    def __init__(self, config: OrlojConfig, priors: Mapping[str, Sequence[float] | CountHistogram]) -> None:
        if not priors:
            raise ValueError("Orloj needs a prior execution-time distribution for at least one application")
        self.config = config
        hists = {
            a: p if isinstance(p, CountHistogram) else self._hist_from_samples(p, config, priors)
            for a, p in priors.items()
        }
        widths = {h.bin_width for h in hists.values()}
        if len(widths) != 1:
            raise ValueError("all application priors must share one bin width")
        self.bin_width = widths.pop()
        self.apps: dict[str, OnlineHistogram] = {
            a: OnlineHistogram(self.bin_width, window=config.window, min_samples=config.min_samples, prior=h)
            for a, h in hists.items()
        }
        self._app_counts: dict[str, int] = dict.fromkeys(self.apps, 0)
        self._dl: FloatArray = np.empty(0)
        self._arr: FloatArray = np.empty(0)
        self._ids: IntArray = np.empty(0, dtype=np.int64)
        # Arrivals since the last decision, merged into the sorted arrays in one pass by _flush():
        # one O(n + k log k) merge per decision instead of an O(n) array copy per arrival.
        self._pending: list[tuple[float, float, int]] = []
        self._reqs: dict[int, Request] = {}
        self._drops: list[Drop] = []
        self._dirty = False
        self._last_pickup = -math.inf
        self.dists: dict[int, BatchDistribution] = {}
        self.tables: dict[int, ScoreTable] = {}
        self.estimate: dict[int, float] = {}
        self._rebuild(0.0)

    @staticmethod
    def _hist_from_samples(
        samples: Sequence[float], config: OrlojConfig, priors: Mapping[str, Sequence[float] | CountHistogram]
    ) -> CountHistogram:
        width = config.bin_width
        if width is None:  # Orloj leaves it open: ~100 bins to the priors' largest P99
            p99 = max(
                float(np.quantile(np.asarray(p, dtype=np.float64), 0.99))
                for p in priors.values()
                if not isinstance(p, CountHistogram) and len(p) > 0
            )
            width = max(p99 / 100.0, 1e-9)
        if len(samples) == 0:
            raise ValueError("an application prior has no samples")
        return CountHistogram.from_samples(samples, width)

    # -- distributions ---------------------------------------------------------------------------
    def _rebuild(self, now: float) -> None:
        """Profiler pickup: recompute L_B(bs), E[L_B(bs)] and the drop estimates (§2.2.5 step 7)."""
        hists = {a: h for a, oh in self.apps.items() if (h := oh.snapshot(now)) is not None}
        total = sum(self._app_counts.values())
        weights = {a: (self._app_counts[a] / total if total else 1.0) for a in hists}
        cfg = self.config
        for bs in cfg.batch_sizes:
            d = batch_distribution(bs, hists, cfg.latency, mode=cfg.mix_mode, weights=weights)
            self.dists[bs] = d
            self.tables[bs] = ScoreTable.build(d, b=cfg.b, cost=cfg.miss_cost)
            if cfg.drop_estimator == "mean":
                self.estimate[bs] = d.mean
            elif cfg.drop_estimator == "min":
                self.estimate[bs] = float(d.l1[0])
            else:
                self.estimate[bs] = d.quantile(float(cfg.drop_estimator.split(":", 1)[1]))
        self._dirty = False
        self._last_pickup = now
        log.debug("orloj pickup at %.3f: E[L_B]=%s", now, {k: round(v, 6) for k, v in self.estimate.items()})

    # -- interface ------------------------------------------------------------------------------
    @property
    def queue_length(self) -> int:
        return int(self._dl.size) + len(self._pending)

    def enqueue(self, request: Request, now: float) -> None:
        if request.rid in self._reqs:
            raise ValueError(f"request {request.rid} is already queued")
        self._pending.append((request.deadline, request.arrival, request.rid))
        self._reqs[request.rid] = request
        if request.app in self._app_counts:
            self._app_counts[request.app] += 1

    def _flush(self) -> None:
        """Merge pending arrivals into the deadline-sorted arrays; equal deadlines keep arrival order."""
        if not self._pending:
            return
        self._pending.sort(key=lambda e: e[0])  # stable: enqueue order among equal deadlines
        pd = np.fromiter((e[0] for e in self._pending), np.float64, len(self._pending))
        pa = np.fromiter((e[1] for e in self._pending), np.float64, len(self._pending))
        pi = np.fromiter((e[2] for e in self._pending), np.int64, len(self._pending))
        at = np.searchsorted(self._dl, pd, side="right")
        self._dl = np.insert(self._dl, at, pd)
        self._arr = np.insert(self._arr, at, pa)
        self._ids = np.insert(self._ids, at, pi)
        self._pending.clear()

    def _drop_phase(self, now: float) -> None:
        """Lines 10-14: leave every queue that cannot be met; time out when none is left."""
        self._flush()
        last_feasible = min(self.estimate.values())
        n = int(np.searchsorted(self._dl, now + last_feasible, side="left"))
        if n:
            for rid in self._ids[:n].tolist():
                self._drops.append(Drop(self._reqs.pop(rid), now, DropReason.CANNOT_MEET_DEADLINE))
            self._dl, self._arr, self._ids = self._dl[n:], self._arr[n:], self._ids[n:]

    def choose_batch_size(self, now: float) -> int | None:
        """Lines 15-21 (after the drop phase): the candidate batch size, or None if nothing is pending."""
        self._flush()
        n = self._dl.size
        keyed: list[tuple[float, int]] = []
        for bs in self.config.batch_sizes:
            start = int(np.searchsorted(self._dl, now + self.estimate[bs], side="left"))
            if start < n:
                keyed.append((float(self._dl[start]), bs))
        if self.config.candidate_order is CandidateOrder.LITERAL_DESC:
            keyed.sort(reverse=True)
        else:
            keyed.sort(key=lambda kb: (kb[0], -kb[1]))
        for _, bs in keyed:
            if n - int(np.searchsorted(self._dl, now + self.estimate[bs], side="left")) >= bs:
                return bs
        return None

    def scores(self, bs: int, now: float) -> tuple[IntArray, FloatArray]:
        """Eq. 2 scores of the members of Q_bs (request ids, scores) at time ``now``."""
        self._flush()
        start = int(np.searchsorted(self._dl, now + self.estimate[bs], side="left"))
        return self._ids[start:], scores_by_slack(self.tables[bs], self._dl[start:] - now)

    def next_batch(self, now: float, worker: int) -> Batch | None:
        if self._dirty and now - self._last_pickup >= self.config.pickup_interval:
            self._rebuild(now)
        self._drop_phase(now)
        cand = self.choose_batch_size(now)
        if cand is None:
            return None
        start = int(np.searchsorted(self._dl, now + self.estimate[cand], side="left"))
        # Past the largest bin edge (slack > max l2) every bin is in case 1 and Eq. 2 falls strictly with
        # slack, so of those requests only the first ``cand`` (earliest deadlines) can make the batch:
        # scoring stops there, which keeps the decision independent of the queue length.
        tab = self.tables[cand]
        end = int(np.searchsorted(self._dl, now + float(tab.l2[-1]), side="right")) + cand
        sc = scores_by_slack(tab, self._dl[start:end] - now)
        if cand >= sc.size:
            pick = np.arange(sc.size)
        else:
            thr = np.partition(sc, sc.size - cand)[sc.size - cand]
            above = np.flatnonzero(sc > thr)
            ties = np.flatnonzero(sc == thr)[: cand - above.size]  # suffix is (D, arrival)-sorted
            pick = np.sort(np.concatenate([above, ties]))
        idx = pick + start
        reqs = [self._reqs.pop(int(r)) for r in self._ids[idx]]
        keep = np.ones(self._dl.size, dtype=bool)
        keep[idx] = False
        self._dl, self._arr, self._ids = self._dl[keep], self._arr[keep], self._ids[keep]
        return Batch(reqs, worker, now, self.dists[cand].mean, reqs[0].model)

    def on_complete(self, batch: Batch, timings: BatchTimings, now: float) -> None:
        """Feed profiled solo times into the per-application windows (§1.3 profiler)."""
        by_id = {r.rid: r for r in batch.requests}
        for rid, solo in timings.solo_times.items():
            r = by_id.get(rid)
            if r is None:
                raise ValueError(f"timings mention request {rid}, which is not in the batch")
            oh = self.apps.get(r.app)
            if oh is None:
                oh = self.apps[r.app] = OnlineHistogram(
                    self.bin_width, window=self.config.window, min_samples=self.config.min_samples
                )
                self._app_counts.setdefault(r.app, 0)
            oh.observe(solo, now)
            self._dirty = True

    def take_drops(self) -> list[Drop]:
        out, self._drops = self._drops, []
        return out

    def next_wakeup(self, now: float) -> float | None:
        return None  # lazy: a batch is formed whenever the worker is free and anything is pending
