"""The Nash-social-welfare (proportional-fair) step: maximise ∏_i 1/ρ_i(G_i) (Themis §3.3.1, Pseudocode 1 line 6).

The paper solves it with Gurobi. We offer two solvers over the same bids:

* `exact_nsw`: enumerates every assignment of offered GPUs to bidders (or to nobody). Exact for any bid
  table; only for small instances ((bidders + 1)^|R| assignments).
* `greedy_nsw`: greedy marginal gain on log-utility over placement-equivalence classes. Each step gives
  one bidder the increment d (1 ≤ d ≤ its cap) with the best gain in Σ log 1/ρ per GPU, placed by
  `FreePool` next to what the bidder already holds. Evaluation is lazy (gains only fall as the pool
  shrinks). For separable concave log-utilities (identical GPUs: ρ depends on the count only, Eq. 1 with
  its elapsed term is log-concave in k) one-GPU greedy is optimal; the d-lookahead handles the
  non-concave steps a locality change causes. It is a heuristic there — checked against `exact_nsw` in
  tests/unit/themis/test_nsw.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tessera.cluster import Cluster, Locality
from tessera.cluster.pool import Anchor, FreePool, Home
from tessera.policy.themis.bids import Bid

Solution = dict[str, list[str]]


def objective(bids: Sequence[Bid], cluster: Cluster, sol: Mapping[str, Sequence[str]]) -> float:
    """Σ_i log ρ_i(G_i) (lower is better): the NSW objective in log form."""
    total = 0.0
    for b in bids:
        gs = sol.get(b.app_id, ())
        a = b.held.copy()
        a.add(cluster, gs)
        total += b.log_rho(len(gs), a.locality())
    return total


def exact_nsw(
    bids: Sequence[Bid], cluster: Cluster, offer: Sequence[str], homes: Sequence[Home] = ()
) -> Solution:
    """Brute force over all (len(bids)+1)^len(offer) assignments; of equal ones, the one that gives
    most bidders' GPUs back to them (their homes), then the first found."""
    m = len(bids)
    home = {h.owner: h.gpus for h in homes}
    best: Solution = {b.app_id: [] for b in bids}
    best_val = objective(bids, cluster, best)
    best_back = 0
    for assign in itertools.product(range(m + 1), repeat=len(offer)):
        sol: Solution = {b.app_id: [] for b in bids}
        ok = True
        for g, who in zip(offer, assign, strict=True):
            if who < m:
                lst = sol[bids[who].app_id]
                lst.append(g)
                if len(lst) > bids[who].cap:
                    ok = False
                    break
        if not ok:
            continue
        val = objective(bids, cluster, sol)
        if val > best_val + 1e-12:
            continue
        back = sum(len(home[i].intersection(gs)) for i, gs in sol.items() if i in home) if home else 0
        if val < best_val - 1e-12 or back > best_back:
            best, best_val, best_back = sol, val, back
    return best


def exact_size(n_bidders: int, n_gpus: int) -> int:
    return int((n_bidders + 1) ** n_gpus)


@dataclass(slots=True)
class WarmStart:
    """What the warm starts of one auction share (one per bidder, each handing out that bidder's bundle to
    the others): the start allocation, each bidder's anchor on it, and each bidder's evaluations by what
    they read of the pool. Most bidders are untouched by any one warm start; without this, each of the N
    solves rebuilt and re-evaluated all N of them (O(N²) a round). Shared anchors are read-only."""

    alloc: Mapping[str, Sequence[str]]
    anchors: dict[str, Anchor] = field(default_factory=dict)
    gains: dict[str, dict[tuple[object, ...], tuple[float, int]]] = field(default_factory=dict)

    def anchor(self, b: Bid, cluster: Cluster) -> Anchor:
        a = self.anchors.get(b.app_id)
        if a is None:
            a = self.anchors[b.app_id] = b.held.copy()
            a.add(cluster, self.alloc.get(b.app_id, ()))
        return a


def greedy_nsw(
    bids: Sequence[Bid],
    cluster: Cluster,
    pool: FreePool,
    start: Mapping[str, Sequence[str]] | WarmStart | None = None,
    polish_limit: int = 8,
) -> Solution:
    """Greedy marginal-gain NSW. Takes GPUs out of `pool`; `start` is a warm start (GPUs not in pool)."""
    greedy = _Greedy(bids, cluster, pool, start if isinstance(start, WarmStart) else WarmStart(start or {}))
    greedy.seat_entrants()
    greedy.grow()
    alloc = greedy.alloc
    if start is None and len(bids) > 1 and pool.size + sum(len(v) for v in alloc.values()) <= polish_limit:
        polish(bids, cluster, alloc, pool)
    return alloc


class _Greedy:
    """The greedy's state: each bidder's GPUs so far and where they sit (its anchor)."""

    def __init__(self, bids: Sequence[Bid], cluster: Cluster, pool: FreePool, start: WarmStart) -> None:
        self.bids, self.cluster, self.pool, self.start = bids, cluster, pool, start
        self.alloc: Solution = {b.app_id: list(start.alloc.get(b.app_id, ())) for b in bids}
        self._grown: dict[str, Anchor] = {}  # anchors of the bidders given GPUs here (own copies)
        self.maxima = pool.max_free()

    def anchor(self, b: Bid) -> Anchor:
        """Where the bidder's GPUs sit: the warm start's anchor until this solve gives it GPUs."""
        own = self._grown.get(b.app_id)
        return own if own is not None else self.start.anchor(b, self.cluster)

    def evaluate(self, b: Bid) -> tuple[float, int]:
        """The bidder's best gain per GPU in Σ log 1/ρ and the increment d that gets it (0: none helps).
        Remembered by everything it reads (GPUs held, their locality, what `predict` reads of the pool):
        the same inputs give the same answer in every solve of the auction."""
        k = len(self.alloc[b.app_id])
        anchor = self.anchor(b)
        cur = b.log_rho(k, anchor.locality())
        top = min(b.cap - k, self.pool.size)
        if top < 1:
            return 0.0, 0
        key = (k, anchor.count, anchor.locality(), *self.pool.outlook(anchor, self.maxima))
        seen = self.start.gains.setdefault(b.app_id, {})
        got = seen.get(key)
        if got is None:
            got = seen[key] = self._evaluate(b, k, top, anchor, cur)
        return got

    def _evaluate(self, b: Bid, k: int, top: int, anchor: Anchor, cur: float) -> tuple[float, int]:
        best_g, best_d = 0.0, 0
        for d in range(1, top + 1):
            loc = self.pool.predict(anchor, d, self.maxima)
            if loc is None:
                break
            g = (cur - b.log_rho(k + d, loc)) / d
            if g > best_g + 1e-12:
                best_g, best_d = g, d
        return best_g, best_d

    def take(self, b: Bid, d: int, grow_to: int) -> None:
        anchor = self._grown.get(b.app_id)
        if anchor is None:
            anchor = self._grown[b.app_id] = self.anchor(b).copy()
        got = self.pool.take(anchor, d, grow_to=grow_to, owner=b.app_id)
        self.alloc[b.app_id].extend(got)
        anchor.add(self.cluster, got)

    def seat_entrants(self) -> None:
        """Entrants (holding nothing, ρ_old = ρ_cap) all win a first GPU before anyone grows, because that
        step's gain dwarfs every other. Seat them first, the most placement-sensitive first, so the app
        that would lose most on a spread placement picks its region before the others (Figure 5, inst. 2).
        An App back at lease end whose GPUs are free goes before them all: its region is the one it held."""
        entrants = [b for b in self.bids if b.held.count == 0 and not self.alloc[b.app_id] and b.cap > 0]
        if 0 < len(entrants) <= self.pool.size:
            for b in sorted(entrants, key=lambda b: (not self.pool.at_home(b.app_id), -_regret(b))):
                self.take(b, 1, b.cap)
            self.maxima = self.pool.max_free()

    def grow(self) -> None:
        """Give the best increment, one at a time, until the pool is empty or nobody gains; gains only
        fall as the pool shrinks, so a stale heap entry is re-evaluated when it comes up (lazy greedy)."""
        version = 0
        heap: list[tuple[float, int, str, int, int]] = []
        for order, b in enumerate(self.bids):
            g, d = self.evaluate(b)
            if d:
                heap.append((-g, order, b.app_id, d, version))
        heapq.heapify(heap)
        by_id = {b.app_id: b for b in self.bids}
        order_of = {b.app_id: i for i, b in enumerate(self.bids)}
        while heap and self.pool.size:
            _, order, app_id, d, ver = heapq.heappop(heap)
            b = by_id[app_id]
            if ver != version:
                g, d = self.evaluate(b)
                if d:
                    heapq.heappush(heap, (-g, order, app_id, d, version))
                continue
            self.take(b, d, b.cap - len(self.alloc[app_id]))
            version += 1
            self.maxima = self.pool.max_free()
            g, d = self.evaluate(b)
            if d:
                heapq.heappush(heap, (-g, order_of[app_id], app_id, d, version))


def _regret(b: Bid) -> float:
    """How much worse the app's full bundle gets when spread across racks instead of kept on one GPU slot."""
    k = max(1, b.cap)
    return b.log_rho(k, Locality.CROSS_RACK) - b.log_rho(k, Locality.SLOT if k > 1 else Locality.GPU)


def polish(
    bids: Sequence[Bid],
    cluster: Cluster,
    alloc: Solution,
    pool: FreePool,
    fixed: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Local search on a small greedy solution: move one GPU (to another bidder or back to the pool) or
    swap two GPUs, while Σ log ρ falls. Repairs the greedy's placement mistakes on small offers."""
    _Polish(bids, cluster, alloc, pool, fixed).run()


class _Polish:
    def __init__(
        self,
        bids: Sequence[Bid],
        cluster: Cluster,
        alloc: Solution,
        pool: FreePool,
        fixed: Mapping[str, Sequence[str]] | None,
    ) -> None:
        self.bids, self.cluster, self.alloc, self.pool = bids, cluster, alloc, pool
        self.keep = {g for v in (fixed or {}).values() for g in v}
        self.owner = {g: b.app_id for b in bids for g in alloc[b.app_id] if g not in self.keep}
        self.by_id = {b.app_id: b for b in bids}
        self.free = pool.ids()

    def term(self, b: Bid, gs: Sequence[str]) -> float:
        a = b.held.copy()
        a.add(self.cluster, gs)
        return b.log_rho(len(gs), a.locality())

    def run(self) -> None:
        improved, passes = True, 0
        while improved and passes < 20:
            improved, passes = False, passes + 1
            for g in list(self.owner):
                i = self.owner[g]
                # Move g to another bidder, or swap g with one of that bidder's GPUs or a free GPU.
                if self._with_bidder(g, i) or self._with_free(g, i):
                    improved = True

    def _with_bidder(self, g: str, i: str) -> bool:
        """Move g from bidder i to another bidder, or swap it with one of theirs, if Σ log ρ falls."""
        alloc, term, bi = self.alloc, self.term, self.by_id[i]
        base_i = term(bi, alloc[i])
        without_g = [x for x in alloc[i] if x != g]
        for bj in self.bids:
            j = bj.app_id
            if j == i:
                continue
            base = base_i + term(bj, alloc[j])
            if len(alloc[j]) < bj.cap and term(bi, without_g) + term(bj, [*alloc[j], g]) < base - 1e-12:
                alloc[i], alloc[j] = without_g, [*alloc[j], g]
                self.owner[g] = j
                return True
            for h in alloc[j]:
                if h in self.keep:
                    continue
                ni = [*without_g, h]
                nj = [x if x != h else g for x in alloc[j]]
                if term(bi, ni) + term(bj, nj) < base - 1e-12:
                    alloc[i], alloc[j] = ni, nj
                    self.owner[g], self.owner[h] = j, i
                    return True
        return False

    def _with_free(self, g: str, i: str) -> bool:
        """Swap g of bidder i with a free GPU if Σ log ρ falls."""
        bi = self.by_id[i]
        base_i = self.term(bi, self.alloc[i])
        without_g = [x for x in self.alloc[i] if x != g]
        for h in self.free:
            ni = [*without_g, h]
            if self.term(bi, ni) < base_i - 1e-12:
                self.alloc[i] = ni
                del self.owner[g]
                self.owner[h] = i
                self.free = [x if x != h else g for x in self.free]
                self.pool.remove([h])
                self.pool.put([g])
                return True
        return False
