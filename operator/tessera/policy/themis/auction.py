"""The partial-allocation auction (Themis Pseudocode 1 lines 5–11, §3.3.1).

G_pf = argmax ∏ 1/ρ_i; for each bidder i, G^{-i}_pf without it; hidden payment
c_i = ∏_{j≠i} ρ_j(G^{-i}_{j,pf}) / ∏_{j≠i} ρ_j(G_{j,pf}) ∈ (0, 1]; bidder i keeps ⌊c_i·|G_i,pf|⌋ GPUs
(indivisible GPUs: Tessera's rounding), packed next to what it holds; the rest is the leftover L.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tessera.cluster import Cluster, Locality
from tessera.cluster.pool import FreePool, Home
from tessera.policy.themis.bids import Bid
from tessera.policy.themis.nsw import Solution, WarmStart, exact_nsw, exact_size, greedy_nsw, objective

SolverName = Literal["auto", "exact", "greedy"]


@dataclass(slots=True)
class AuctionResult:
    pf: Solution  # G_{i,pf}
    payment: dict[str, float]  # c_i
    won: Solution  # G_i = c_i · G_{i,pf} after rounding
    leftover: list[str]  # L: offered GPUs nobody won (hidden payments and unclaimed GPUs)
    solver: str
    without: dict[str, Solution] = field(default_factory=dict)  # G^{-i}_pf


def solve_pf(
    bids: Sequence[Bid],
    cluster: Cluster,
    offer: Sequence[str],
    solver: SolverName = "auto",
    exact_limit: int = 20_000,
    start: Mapping[str, Sequence[str]] | WarmStart | None = None,
    homes: Sequence[Home] = (),
) -> tuple[Solution, str]:
    """One NSW solve. `start` (greedy only) warm-starts from a partial allocation outside `offer`; `homes`
    are the GPUs bidders held until their lease ended (placement only: equal solutions give them back)."""
    use_exact = solver == "exact" or (
        solver == "auto" and start is None and exact_size(len(bids), len(offer)) <= exact_limit
    )
    if use_exact:
        return exact_nsw(bids, cluster, offer, homes), "exact"
    return greedy_nsw(bids, cluster, FreePool(cluster, offer, homes), start), "greedy"


def run_auction(
    bids: Sequence[Bid],
    cluster: Cluster,
    offer: Sequence[str],
    *,
    solver: SolverName = "auto",
    exact_limit: int = 20_000,
    min_keep: int = 1,
    homes: Sequence[Home] = (),
) -> AuctionResult:
    """Partial allocation over the offer. `min_keep` GPUs of a non-empty PF bundle always stay with the
    winner (Tessera's choice, configurable; 0 = the literal floor): with indivisible GPUs and starving bidders
    (ρ_old = ρ_cap) the literal floor(c_i·k) strips every winner to zero under contention."""
    if len(set(offer)) != len(offer):
        raise ValueError("offer lists a GPU twice")
    # The solves without each bidder only price it (their placements are not granted): no homes there.
    pf, used = solve_pf(bids, cluster, offer, solver, exact_limit, homes=homes)
    payment: dict[str, float] = {}
    without: dict[str, Solution] = {}
    logs_pf = {b.app_id: b.log_rho(len(pf[b.app_id]), _loc(b, cluster, pf[b.app_id])) for b in bids}
    warm = WarmStart(pf)  # shared by the warm starts below
    for b in bids:
        others = [o for o in bids if o.app_id != b.app_id]
        if not others:
            payment[b.app_id] = 1.0
            continue
        if not pf[b.app_id]:
            payment[b.app_id] = 1.0
            without[b.app_id] = {o.app_id: list(pf[o.app_id]) for o in others}
            continue
        if used == "exact":
            sol, _ = solve_pf(others, cluster, offer, "exact", exact_limit)
        else:
            # Warm start: everyone else keeps their PF bundle and the greedy hands out i's GPUs. For
            # separable concave utilities this is the exact optimum without i (supply only grew).
            sol, _ = solve_pf(others, cluster, pf[b.app_id], "greedy", start=warm)
            if len(bids) * len(offer) <= 4096:  # small: also solve from scratch, keep the better one
                cold, _ = solve_pf(others, cluster, offer, "greedy")
                if objective(others, cluster, cold) < objective(others, cluster, sol):
                    sol = cold
        without[b.app_id] = sol
        # A bidder whose bundle is the same without i adds exactly 0 to the sum: only the others that
        # gained from i's GPUs are evaluated (a warm start changes a few of the N bundles, not all).
        log_c = sum(
            o.log_rho(len(sol[o.app_id]), _loc(o, cluster, sol[o.app_id])) - logs_pf[o.app_id]
            for o in others
            if sol[o.app_id] != pf[o.app_id]
        )
        # A heuristic solve can make the "without i" welfare look worse than with i; c is at most 1.
        payment[b.app_id] = min(1.0, math.exp(log_c))
    won: Solution = {}
    taken: set[str] = set()
    home = {h.owner: h.gpus for h in homes}
    for b in bids:
        bundle = pf[b.app_id]
        n = math.floor(payment[b.app_id] * len(bundle) + 1e-9)
        if bundle:
            n = max(n, min(min_keep, len(bundle)))
        won[b.app_id] = _tightest(cluster, b, bundle, n, home.get(b.app_id, frozenset()))
        taken.update(won[b.app_id])
    leftover = [g for g in offer if g not in taken]
    return AuctionResult(pf=pf, payment=payment, won=won, leftover=leftover, solver=used, without=without)


def _loc(b: Bid, cluster: Cluster, gpus: Sequence[str]) -> Locality:
    a = b.held.copy()
    a.add(cluster, gpus)
    return a.locality()


def _tightest(
    cluster: Cluster, b: Bid, bundle: Sequence[str], n: int, home: frozenset[str] = frozenset()
) -> list[str]:
    """n GPUs of the bundle packed as tightly as possible with what the app holds (machines it is on
    first, then the machines where the bundle is densest); on a machine, GPUs it held before first."""
    if n >= len(bundle):
        return list(bundle)
    by_machine = cluster.by_machine(bundle)
    order = sorted(by_machine, key=lambda m: (m not in b.held.nodes, -len(by_machine[m]), m))
    out: list[str] = []
    for m in order:
        for g in sorted(by_machine[m], key=lambda g: g not in home):
            if len(out) == n:
                return out
            out.append(g)
    return out
