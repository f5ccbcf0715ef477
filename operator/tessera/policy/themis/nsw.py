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

from tessera.cluster import Cluster, Locality
from tessera.cluster.pool import Anchor, FreePool
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


def exact_nsw(bids: Sequence[Bid], cluster: Cluster, offer: Sequence[str]) -> Solution:
    """Brute force over all (len(bids)+1)^len(offer) assignments; ties keep the first found."""
    m = len(bids)
    best: Solution = {b.app_id: [] for b in bids}
    best_val = objective(bids, cluster, best)
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
        if val < best_val - 1e-12:
            best, best_val = sol, val
    return best


def exact_size(n_bidders: int, n_gpus: int) -> int:
    return int((n_bidders + 1) ** n_gpus)


def greedy_nsw(
    bids: Sequence[Bid],
    cluster: Cluster,
    pool: FreePool,
    start: Mapping[str, Sequence[str]] | None = None,
    polish_limit: int = 8,
) -> Solution:
    """Greedy marginal-gain NSW. Takes GPUs out of `pool`; `start` is a warm start (GPUs not in pool)."""
    alloc: Solution = {b.app_id: list((start or {}).get(b.app_id, ())) for b in bids}
    anchors: dict[str, Anchor] = {}
    for b in bids:
        a = b.held.copy()
        a.add(cluster, alloc[b.app_id])
        anchors[b.app_id] = a
    by_id = {b.app_id: b for b in bids}
    version = 0
    maxima = pool.max_free()

    def evaluate(b: Bid) -> tuple[float, int]:
        k = len(alloc[b.app_id])
        anchor = anchors[b.app_id]
        cur = b.log_rho(k, anchor.locality())
        best_g, best_d = 0.0, 0
        for d in range(1, min(b.cap - k, pool.size) + 1):
            loc = pool.predict(anchor, d, maxima)
            if loc is None:
                break
            g = (cur - b.log_rho(k + d, loc)) / d
            if g > best_g + 1e-12:
                best_g, best_d = g, d
        return best_g, best_d

    # Entrants (holding nothing, ρ_old = ρ_cap) all win a first GPU before anyone grows, because that
    # step's gain dwarfs every other. Seat them first, the most placement-sensitive first, so the app
    # that would lose most on a spread placement picks its region before the others (Figure 5, inst. 2).
    entrants = [b for b in bids if b.held.count == 0 and not alloc[b.app_id] and b.cap > 0]
    if 0 < len(entrants) <= pool.size:
        for b in sorted(entrants, key=lambda b: -_regret(b)):
            got = pool.take(anchors[b.app_id], 1, grow_to=b.cap)
            alloc[b.app_id].extend(got)
            anchors[b.app_id].add(cluster, got)
        maxima = pool.max_free()
    heap: list[tuple[float, int, str, int, int]] = []
    for order, b in enumerate(bids):
        g, d = evaluate(b)
        if d:
            heap.append((-g, order, b.app_id, d, version))
    heapq.heapify(heap)
    order_of = {b.app_id: i for i, b in enumerate(bids)}
    while heap and pool.size:
        _, order, app_id, d, ver = heapq.heappop(heap)
        b = by_id[app_id]
        if ver != version:
            g, d = evaluate(b)
            if d:
                heapq.heappush(heap, (-g, order, app_id, d, version))
            continue
        k = len(alloc[app_id])
        got = pool.take(anchors[app_id], d, grow_to=b.cap - k)
        alloc[app_id].extend(got)
        anchors[app_id].add(cluster, got)
        version += 1
        maxima = pool.max_free()
        g, d = evaluate(b)
        if d:
            heapq.heappush(heap, (-g, order_of[app_id], app_id, d, version))
    if start is None and len(bids) > 1 and pool.size + sum(len(v) for v in alloc.values()) <= polish_limit:
        polish(bids, cluster, alloc, pool)
    return alloc


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
    keep = {g for v in (fixed or {}).values() for g in v}

    def term(b: Bid, gs: Sequence[str]) -> float:
        a = b.held.copy()
        a.add(cluster, gs)
        return b.log_rho(len(gs), a.locality())

    owner = {g: b.app_id for b in bids for g in alloc[b.app_id] if g not in keep}
    by_id = {b.app_id: b for b in bids}
    free = pool.ids()
    improved, passes = True, 0
    while improved and passes < 20:
        improved, passes = False, passes + 1
        for g in list(owner):
            i = owner[g]
            bi = by_id[i]
            base_i = term(bi, alloc[i])
            without_g = [x for x in alloc[i] if x != g]
            # Move g to another bidder, or swap g with one of that bidder's GPUs or a free GPU.
            for bj in bids:
                j = bj.app_id
                if j == i:
                    continue
                base = base_i + term(bj, alloc[j])
                if len(alloc[j]) < bj.cap and term(bi, without_g) + term(bj, [*alloc[j], g]) < base - 1e-12:
                    alloc[i], alloc[j] = without_g, [*alloc[j], g]
                    owner[g] = j
                    improved = True
                    break
                done = False
                for h in alloc[j]:
                    if h in keep:
                        continue
                    ni = [*without_g, h]
                    nj = [x if x != h else g for x in alloc[j]]
                    if term(bi, ni) + term(bj, nj) < base - 1e-12:
                        alloc[i], alloc[j] = ni, nj
                        owner[g], owner[h] = j, i
                        improved = done = True
                        break
                if done:
                    break
            else:
                for h in free:
                    ni = [*without_g, h]
                    if term(bi, ni) < base_i - 1e-12:
                        alloc[i] = ni
                        del owner[g]
                        owner[h] = i
                        free = [x if x != h else g for x in free]
                        pool.remove([h])
                        pool.put([g])
                        improved = True
                        break
