"""Symphony's deferred batch scheduling across many GPUs, Symphony §3.1-3.2 (Algorithm 1).

Per model: a deadline-ordered queue and one candidate (B, exec, latest) with exec = max(now, d − ℓ(|B|+1))
(the frontrun) and latest = d − ℓ(|B|). A model timer at ``exec`` grants the lowest-id GPU free by then
(argmin id concentrates load, A.7); a GPU timer at ``G.free`` picks the valid candidate with the closest
``latest``. Comparisons use ``≤`` (A.3 decision 1; the §3.3 trace only reproduces with it). The timeout
variant replaces the frontrun with ``a_head + k``; ``k = 0`` is eager dispatch (Symphony §3.1, §3.4).
GETBATCH is head-greedy and drops requests that cannot finish even alone (A.5 default); a candidate
whose ``latest`` passes is recomputed (A.3 decision 4, optional). ``get_batch="earlyDropForTarget"`` adds
the open-source code's early drop (A.5, ``GetBatchByExpandedWindow``): while the queue holds a target batch,
a head that cannot finish in it is shed before dispatch, so under overload every GPU still runs target-size
batches and goodput stays flat at the peak (Symphony §3.5) instead of collapsing into small late batches.

The target batch size solves A.6 Eq. (1)-(2) per model, as the authors' code computes it
(``target_batch="modelRate"``, the default; nexuslb ``BatchSizeEstimator`` with ``xrps = 1, xstd = 2`` and
``RpsMeter``, spec A.5): the model's rate r = mean + 2·std of its arrival rate over the last 100 bins of 50 ms,
n(b) = r·ℓ(b)/b the GPUs that model needs at batch b, and the target the largest b with ℓ(b)·(1 + 1/n(b)) ≤
budget, i.e. ℓ(b) + b/r ≤ budget; before the first bin is sealed, the largest b with ℓ(b) ≤ budget/2 (the
Nexus rule the code starts from). The budget is the SLO (the head request's deadline − arrival): there is no
network delay to subtract here (the operator folds it into ℓ(b)). ``target_batch="clusterGpus"`` keeps the rule
this scheduler used before: N = every GPU of the shard, the largest b with (1 + 1/N)·ℓ(b) ≤ SLO, whatever
share of them the model needs.

Cost (target ≥ 100,000 requests/s on one core, Symphony §4.2):

* Timers are one heap of ``(time, seq, code)`` entries, deleted lazily: an entry is live while its ``seq``
  is still the one recorded for its model, stale check or GPU, so cancelling is O(1). ``seq`` is the push
  order, which also fixes the order of timers due at the same instant. A model timer due at once is not
  pushed when no GPU is free (it could only find none), so a busy cluster adds one stale check per arrival.
* GETBATCH is incremental: ℓ(b) is tabulated once per model with its running maximum over ``2..b``, and
  the batch size walks from the previous candidate's size instead of growing from 1 (the window only moves
  at its head and tail). Because ``d − x`` rounds monotonically in ``x``, testing the running maximum gives
  exactly the head-greedy loop's answer, also for non-monotone measured tables.
* Free GPUs come from two heaps (busy by free time, idle by id): a model timer costs O(log G) amortised; a
  GPU timer scans the shard's candidates, O(M), fine for the "dozens of models" a shard holds (A.7).
* Per-model state lives in flat lists indexed by model (models ordered by name, the GPU timer's tie-break),
  so an arrival allocates one queue tuple and no candidate object.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter

from tessera.policy.serving.common import Batch, Drop, DropReason, LinearProfile, Request

_ARRIVAL = itemgetter(3)
_heappush, _heappop, _nextafter, _INF = heapq.heappush, heapq.heappop, math.nextafter, math.inf
_CANNOT_MEET = DropReason.CANNOT_MEET_DEADLINE

TARGET_BATCH_RULES = ("modelRate", "clusterGpus")
# The authors' RpsMeter and BatchSizeEstimator (nexuslb rankmt/common.h RankmtConfig::Default, model_thread.cpp
# ``bse_(1.0, 2.0)``): 50 ms bins, a window of 100 bins, r = 1.0·mean + 2.0·std.
RPS_BIN_S = 0.05
RPS_WINDOW_BINS = 100
RPS_STD_MULTIPLIER = 2.0

# A queue entry: (deadline, rid, arrival order, arrival, request). Ordering on the first three keeps the
# deadline order with ties to the lower rid, then to the earlier enqueue, and never compares requests.
_Entry = tuple[float, int, int, float, Request]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A model's candidate batch c_M = (B, exec, latest) (Algorithm 1 lines 4-7); ``size`` = |B|."""

    size: int
    exec: float
    latest: float


class SymphonyScheduler:
    """Algorithm 1 for a shard of models over ``n_gpus`` GPUs (ids 0..n−1).

    Drive it with ``enqueue(request, now)`` and ``advance(now)``, which fires every timer due by
    ``now`` and returns the batches dispatched (``Batch.worker`` is the GPU, ``Batch.start`` its exec
    time); ``next_timer()`` says when to call ``advance`` next. ``timeout`` None = deferred (Symphony);
    a number k = timeout batching inside the same framework, 0 = eager. ``timeout`` may be changed
    between calls; it applies from the next candidate update.
    """

    __slots__ = (
        "_arrivals",
        "_busy",
        "_by_rate",
        "_cexec",
        "_clatest",
        "_cseq",
        "_csize",
        "_drops",
        "_early",
        "_gbin",
        "_gend",
        "_gseq",
        "_idle",
        "_in_idle",
        "_index",
        "_lat",
        "_m",
        "_maxb",
        "_mbin",
        "_mcount",
        "_midx",
        "_morigin",
        "_mrate",
        "_msq",
        "_msum",
        "_mwin",
        "_names",
        "_out",
        "_pmax",
        "_queues",
        "_seq",
        "_solo",
        "_sseq",
        "_targets",
        "_timers",
        "_tslo",
        "_tval",
        "gpu_free",
        "profiles",
        "refresh_stale",
        "timeout",
    )

    def __init__(
        self,
        profiles: Mapping[str, LinearProfile],
        n_gpus: int,
        *,
        timeout: float | None = None,
        refresh_stale: bool = True,
        get_batch: str = "headGreedy",
        target_batch: str = "modelRate",
    ) -> None:
        if n_gpus < 1:
            raise ValueError(f"Symphony needs at least one GPU, got {n_gpus}")
        if not profiles:
            raise ValueError("Symphony needs at least one model profile")
        if get_batch not in ("headGreedy", "earlyDropForTarget"):
            raise ValueError(f"get_batch must be headGreedy or earlyDropForTarget, got {get_batch!r}")
        self._early = get_batch == "earlyDropForTarget"
        if target_batch not in TARGET_BATCH_RULES:
            raise ValueError(f"target_batch must be one of {TARGET_BATCH_RULES}, got {target_batch!r}")
        self._by_rate = target_batch == "modelRate"
        self._targets: dict[tuple[int, float], int] = {}
        self.profiles = dict(profiles)
        self.timeout = timeout
        self.refresh_stale = refresh_stale
        self.gpu_free = [-math.inf] * n_gpus
        # Models in name order: the GPU timer breaks equal ``latest`` by name (lowest index first).
        self._names = sorted(self.profiles)
        self._index = {m: i for i, m in enumerate(self._names)}
        m = self._m = len(self._names)
        self._queues: list[list[_Entry]] = [[] for _ in range(m)]
        self._lat: list[list[float]] = [[0.0] for _ in range(m)]  # ℓ(b) at index b, grown on demand
        self._pmax: list[list[float]] = [[-math.inf, -math.inf] for _ in range(m)]  # max ℓ(2..b)
        self._maxb = [self.profiles[n].max_batch for n in self._names]
        for i in range(m):
            self._grow(i, 2)
        self._solo = [lat[1] for lat in self._lat]
        self._tslo = [math.nan] * m  # last SLO whose target batch was asked for, per model
        self._tval = [1] * m
        # Per-model arrival-rate meter (modelRate): the bin the counter is filling, its hits, the window of
        # sealed bin rates (empty until the first bin with a hit is sealed) and the rate r it gives.
        self._morigin = math.nan  # time of bin 0: the first request seen
        self._gbin, self._gend = 0, -math.inf  # the latest bin seen on the grid, and when it ends
        self._mbin = [0] * m
        self._mcount = [0] * m
        self._mwin: list[list[int]] = [[] for _ in range(m)]  # hits per sealed bin, a ring once full
        self._midx = [0] * m  # the ring's oldest entry
        self._msum = [0] * m  # Σ hits and Σ hits² over the window
        self._msq = [0] * m
        self._mrate = [math.nan] * m
        # Candidate per model: size 0 = none; _cseq/_sseq = seq of its live model / stale timer (−1 none).
        self._csize = [0] * m
        self._cexec = [0.0] * m
        self._clatest = [0.0] * m
        self._cseq = [-1] * m
        self._sseq = [-1] * m
        self._gseq = [-1] * n_gpus  # seq of each GPU's live timer
        # Timer codes: i < m model timer, m ≤ code < 2m stale check of model code − m, < 0 GPU ~code.
        self._timers: list[tuple[float, int, int]] = []
        self._seq = itertools.count()
        self._arrivals = itertools.count()
        self._busy: list[tuple[float, int]] = []  # (free time, gpu), lazily validated
        self._idle: list[int] = list(range(n_gpus))  # gpu ids free as of the last model timer
        self._in_idle = [True] * n_gpus
        self._drops: list[Drop] = []
        self._out: list[Batch] = []

    @property
    def target_batch(self) -> str:
        """The early-drop GETBATCH's target rule: ``modelRate`` or ``clusterGpus``."""
        return "modelRate" if self._by_rate else "clusterGpus"

    def _grow(self, i: int, upto: int) -> None:
        """Tabulate ℓ(b) and its running maximum over 2..b for b ≤ ``upto`` (at least doubling)."""
        lat, pmax = self._lat[i], self._pmax[i]
        prof = self.profiles[self._names[i]]
        for b in range(len(lat), max(upto, 2 * len(lat)) + 1):
            v = prof(b)
            lat.append(v)
            if b >= 2:
                pmax.append(v if v > pmax[-1] else pmax[-1])

    # -- Algorithm 1 ---------------------------------------------------------------------------
    def _update_candidate(self, i: int, now: float) -> None:
        """UPDATECANDIDATE (lines 1-8) with the head-greedy GETBATCH and its drops (A.5)."""
        q = self._queues[i]
        self._shed(i, q, now)
        if not q:
            self._csize[i] = 0
            self._cseq[i] = self._sseq[i] = -1
            return
        d = q[0][0]
        cap = len(q)
        if cap > self._maxb[i]:
            cap = self._maxb[i]
        pmax = self._pmax[i]
        if cap + 1 >= len(pmax):
            self._grow(i, cap + 1)
        # Largest n ≤ cap with d − ℓ(k) ≥ now for all 2 ≤ k ≤ n, walked from the previous size.
        n = self._csize[i]
        if n > cap:
            n = cap
        elif n < 1:
            n = 1
        while n > 1 and d - pmax[n] < now:
            n -= 1
        while n < cap and d - pmax[n + 1] >= now:
            n += 1
        lat = self._lat[i]
        timeout = self.timeout
        if timeout is None:
            ex = d - lat[n + 1]
        else:
            a = q[0][3] if n == 1 else min(q[:n], key=_ARRIVAL)[3]
            ex = a + timeout
        if not ex > now:  # max(now, ex), same tie result
            ex = now
        latest = d - lat[n]
        self._csize[i] = n
        self._cexec[i] = ex
        self._clatest[i] = latest
        timers, seq = self._timers, self._seq
        s = next(seq)
        self._cseq[i] = s
        # A model timer due now that finds no free GPU does nothing, and GPU free times only grow, so
        # it is not pushed at all (most arrivals at high load); ``now`` never goes back, so asking the
        # free-GPU heaps at ``now`` is the same question the timer would ask.
        if ex != now or self._lowest_free(now) is not None:
            _heappush(timers, (ex, s, i))
        if self.refresh_stale:
            s = next(seq)
            self._sseq[i] = s
            _heappush(timers, (_nextafter(latest, _INF), s, self._m + i))
        else:
            self._sseq[i] = -1

    def _shed(self, i: int, q: list[_Entry], now: float) -> None:
        """Drop the queue's head requests that cannot meet their deadline even alone, then (early-drop
        GETBATCH) those the head's batch cannot carry."""
        solo = self._solo[i]
        if q and q[0][0] - solo < now:  # same arithmetic as `latest`, so latest ≥ now
            k = 1
            nq = len(q)
            while k < nq and q[k][0] - solo < now:
                k += 1
            drops = self._drops
            for e in q[:k]:
                drops.append(Drop(e[4], now, _CANNOT_MEET))
            del q[:k]
        if len(q) >= 2 and self._early:  # a batch of min(target, 1) never sheds: no target needed
            if self._by_rate and (now >= self._gend or self._mbin[i] != self._gbin):
                self._meter(i, now)
            # Fast path: the head fits a batch of min(target, |Q|); the loop only runs when it sheds.
            head = q[0]
            slo = head[0] - head[3]
            n = self._tval[i] if self._tslo[i] == slo else self._target(i, slo)
            if n > len(q):
                n = len(q)
            if n >= 2 and head[0] - self._pmax[i][n] < now:
                self._early_drop(i, q, now)

    def _meter(self, i: int, now: float) -> None:
        """Seal model ``i``'s rate bins that ended by ``now`` (RpsMeter::SealCounter every 50 ms, done lazily):
        each sealed bin adds its hits to the window of the last 100; bins before the model's first hit add
        nothing, empty bins after it add 0. The rate r = mean + 2·std (population) of the window's hits/50 ms,
        from exact integer sums of the counts and their squares (O(1) per bin)."""
        if self._morigin != self._morigin:  # nan: no request yet
            return
        if now < self._gend:
            cur = self._gbin
        else:  # a new bin of the shard's grid: remember where it ends (the callers' fast path)
            cur = self._gbin = math.floor((now - self._morigin) / RPS_BIN_S)
            self._gend = self._morigin + (cur + 1) * RPS_BIN_S
        b = self._mbin[i]
        if cur <= b:
            return
        c = self._mcount[i]
        self._mbin[i], self._mcount[i] = cur, 0
        win = self._mwin[i]
        if not win and not c:
            return
        gap = cur - b - 1
        if gap >= RPS_WINDOW_BINS:  # the window is all zeros
            self._mwin[i] = win = [0] * RPS_WINDOW_BINS
            self._midx[i] = s1 = s2 = 0
        else:  # seal this bin's hits, then the empty bins since
            s1, s2, j = self._msum[i], self._msq[i], self._midx[i]
            full = len(win) == RPS_WINDOW_BINS
            for n in (c, *itertools.repeat(0, gap)) if gap else (c,):
                if full:
                    old = win[j]
                    s1 -= old
                    s2 -= old * old
                    win[j] = n
                    j = j + 1 if j + 1 < RPS_WINDOW_BINS else 0
                else:
                    win.append(n)
                    full = len(win) == RPS_WINDOW_BINS
                s1 += n
                s2 += n * n
            self._midx[i] = j
        self._msum[i], self._msq[i] = s1, s2
        k = len(win)
        avg = (s1 / RPS_BIN_S) / k
        std = math.sqrt(k * s2 - s1 * s1) / k / RPS_BIN_S
        self._mrate[i] = avg + RPS_STD_MULTIPLIER * std
        self._tslo[i] = math.nan  # the target is recomputed from the new rate

    def _target(self, i: int, slo: float) -> int:
        """Target batch size for model ``i`` at this SLO (A.6 Eq. 1-2, see the module docstring)."""
        if self._tslo[i] == slo:
            return self._tval[i]
        cap = self._maxb[i]
        if cap + 1 >= len(self._pmax[i]):
            self._grow(i, cap + 1)
        lat = self._lat[i]
        if self._by_rate:
            r = self._mrate[i]
            t = 1
            if math.isnan(r):  # no rate yet: GetMaxBatchWithFullBudget(SLO / 2)
                while t < cap and lat[t + 1] <= slo / 2:
                    t += 1
            elif r > 0:  # BatchSizeEstimator::Estimate: n = r·ℓ(b)/b GPUs; stop at ℓ(b)·(1 + 1/n) > budget
                while t < cap:
                    lb = lat[t + 1]
                    if lb * (1 + 1 / (r * lb / (t + 1))) > slo:
                        break
                    t += 1
            # r = 0 (no hits in the window): n = 0, 1 + 1/n is infinite, the estimator returns 1
        else:
            key = (i, slo)
            got = self._targets.get(key)
            if got is None:
                f = 1 + 1 / len(self.gpu_free)
                t = 1
                while t < cap and f * lat[t + 1] <= slo:
                    t += 1
                self._targets[key] = t
            else:
                t = got
        self._tslo[i], self._tval[i] = slo, t
        return t

    def target_for(self, model: str, slo: float, now: float) -> int:
        """The early-drop GETBATCH's target batch size for ``model`` at this SLO, its rate metered to ``now``."""
        i = self._index.get(model)
        if i is None:
            raise ValueError(f"model {model!r} is not served by this shard")
        if self._by_rate:
            self._meter(i, now)
        return self._target(i, slo)

    def _early_drop(self, i: int, q: list[_Entry], now: float) -> None:
        """Shed heads that cannot finish by their deadline in a batch of min(target, |Q|) started now."""
        pmax, drops = self._pmax[i], self._drops
        while q:
            head = q[0]
            n = self._target(i, head[0] - head[3])
            if n > len(q):
                n = len(q)
            if n < 2 or head[0] - pmax[n] >= now:
                return
            drops.append(Drop(head[4], now, _CANNOT_MEET))
            del q[0]

    def _dispatch(self, i: int, g: int, now: float) -> None:
        """DISPATCH (lines 9-14): refresh the candidate at ``now``, run it on GPU ``g``, prepare the next."""
        self._update_candidate(i, now)
        n = self._csize[i]
        if not n:
            return
        q = self._queues[i]
        reqs = [e[4] for e in q[:n]]
        del q[:n]
        dur = self._lat[i][n]
        ex = self._cexec[i]
        free = ex + dur
        self.gpu_free[g] = free
        heapq.heappush(self._busy, (free, g))
        s = next(self._seq)
        self._gseq[g] = s
        heapq.heappush(self._timers, (free, s, ~g))
        self._out.append(Batch(reqs, g, ex, dur, self._names[i]))
        self._update_candidate(i, now)

    def set_profile(self, model: str, profile: LinearProfile, now: float) -> None:
        """Plan `model` with `profile` from `now` on (e.g. ℓ(b) inflated by BE lanes sharing the GPUs):
        its tables are rebuilt and its candidate recomputed; batches already dispatched keep their times."""
        i = self._index.get(model)
        if i is None:
            raise ValueError(f"model {model!r} is not served by this shard")
        self.profiles[model] = profile
        self._lat[i], self._pmax[i] = [0.0], [-math.inf, -math.inf]
        self._maxb[i] = profile.max_batch
        self._grow(i, 2)
        self._solo[i] = self._lat[i][1]
        self._targets = {k: v for k, v in self._targets.items() if k[0] != i}
        self._tslo[i] = math.nan
        self._update_candidate(i, now)

    def enqueue(self, request: Request, now: float) -> None:
        """ONNEWREQUEST (lines 15-17)."""
        i = self._index.get(request.model)
        if i is None:
            raise ValueError(
                f"request {request.rid} is for model {request.model!r}, not served by this shard"
            )
        if self._early and self._by_rate:  # RpsMeter::Hit, after sealing the bins that ended by now
            if self._morigin != self._morigin:  # nan: the first request starts bin 0
                self._morigin = now
            if now >= self._gend or self._mbin[i] != self._gbin:
                self._meter(i, now)
            self._mcount[i] += 1
        q = self._queues[i]
        e = (request.deadline, request.rid, next(self._arrivals), request.arrival, request)
        if not q or q[-1] < e:
            q.append(e)
        else:
            bisect.insort(q, e)
        self._update_candidate(i, now)

    def _lowest_free(self, t: float) -> int | None:
        """argmin id over GPUs with ``free ≤ t`` (line 19). Model timers fire in time order, so a GPU
        moved to the idle heap stays free until it is dispatched again (which re-enters it as busy)."""
        busy, idle, gf, in_idle = self._busy, self._idle, self.gpu_free, self._in_idle
        while busy and busy[0][0] <= t:
            f, g = heapq.heappop(busy)
            if gf[g] == f and not in_idle[g]:
                in_idle[g] = True
                heapq.heappush(idle, g)
        while idle:
            g = idle[0]
            if gf[g] <= t:
                return g
            heapq.heappop(idle)  # dispatched by its GPU timer meanwhile; its busy entry re-adds it
            in_idle[g] = False
        return None

    def _on_gpu_timer(self, g: int, now: float) -> None:
        """ONGPUTIMER (lines 21-23): the valid candidate with the closest ``latest``, ties to the name."""
        f = self.gpu_free[g]
        csize, cexec, clatest = self._csize, self._cexec, self._clatest
        best = -1
        best_latest = math.inf
        for i in range(self._m):
            if csize[i] and cexec[i] <= f:
                la = clatest[i]
                if f <= la and (best < 0 or la < best_latest):
                    best, best_latest = i, la
        if best >= 0:
            self._dispatch(best, g, now)

    def next_timer(self) -> float | None:
        timers = self._timers
        while timers and not self._live(timers[0]):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def _live(self, e: tuple[float, int, int]) -> bool:
        code = e[2]
        if code < 0:
            return self._gseq[~code] == e[1]
        if code < self._m:
            return self._cseq[code] == e[1]
        return self._sseq[code - self._m] == e[1]

    def advance(self, now: float, *, strictly_before: bool = False) -> list[Batch]:
        """Fire the timers due at or before ``now`` (before it, if ``strictly_before``)."""
        timers = self._timers
        m = self._m
        cseq, sseq, gseq = self._cseq, self._sseq, self._gseq
        heappop = _heappop
        while timers:
            t, s, code = timers[0]
            if t > now or (strictly_before and t == now):
                break
            heappop(timers)
            if code < 0:
                if gseq[~code] == s:
                    self._on_gpu_timer(~code, t)
            elif code < m:
                # ONMODELTIMER (lines 18-20); its candidate is live, so it exists.
                if cseq[code] == s:
                    g = self._lowest_free(self._cexec[code])
                    if g is not None:
                        self._dispatch(code, g, t)
            elif sseq[code - m] == s:
                self._update_candidate(code - m, t)
        out = self._out
        if out:
            self._out = []
            return out
        return []

    def candidate(self, model: str) -> Candidate | None:
        """The model's current candidate batch, or None when its queue holds nothing schedulable."""
        i = self._index.get(model)
        if i is None:
            raise ValueError(f"model {model!r} is not served by this shard")
        if not self._csize[i]:
            return None
        return Candidate(self._csize[i], self._cexec[i], self._clatest[i])

    def take_drops(self) -> list[Drop]:
        out = self._drops
        if out:
            self._drops = []
            return out
        return []

    def take_cancelled(self) -> list[tuple[Batch, float]]:
        """Symphony never cancels a dispatched batch (interface parity with the baselines)."""
        return []


def autoscale_advice(
    n_gpus: int, bad_rate: float, idle_fraction: float, *, bad_threshold: float = 0.01
) -> int:
    """GPUs to add (> 0) or release (< 0), Symphony §3.5: add N·r/(1−r) when the bad
    rate r exceeds the threshold, otherwise release N·f for idle fraction f."""
    if not 0 <= bad_rate < 1 or not 0 <= idle_fraction <= 1:
        raise ValueError(
            f"bad_rate must be in [0,1) and idle_fraction in [0,1], got {bad_rate}, {idle_fraction}"
        )
    if bad_rate > bad_threshold:
        return math.ceil(n_gpus * bad_rate / (1 - bad_rate) - 1e-9)
    return -math.floor(n_gpus * idle_fraction + 1e-9)
