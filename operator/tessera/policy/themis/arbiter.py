"""The Themis ARBITER round (Themis Pseudocode 1 lines 13–21; §3.3.1–3.3.2).

One round is a pure function of (now, apps' state, cluster, free GPUs, config, rng) → grants (with lease
expiry and source: auction or leftover) plus the auction record. The simulator and the operator both
call `Themis.allocate`; nothing here keeps a clock or talks to Kubernetes.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool, Home
from tessera.policy.themis.auction import SolverName, run_auction
from tessera.policy.themis.bids import Bid, make_bid
from tessera.policy.themis.estimate import TidMode
from tessera.policy.training import AppState, Grant, RoundDecision, lease_expiry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ThemisConfig:
    """Arbiter knobs. Defaults are the paper's: f = 0.8, 10-minute leases (Themis §6, §6.4)."""

    fairness_knob: float = 0.8  # f: the top 1−f fraction of apps by ρ bid (Themis §3.3.2, Pseudocode 1)
    lease_s: float = 600.0
    rho_cap: float = 1e6  # ρ of an app holding nothing (∞ in the paper, Themis §3.3.1)
    tid_mode: TidMode = "paper"
    solver: SolverName = "auto"
    exact_limit: int = 64  # largest (bidders+1)^|R| solved by enumeration under "auto"
    min_keep: int = 1  # GPUs a PF winner always keeps after its hidden payment (0 = literal floor)
    # N of the filter: "active" ranks every active app (Themis §3.3.2: k = ⌈(1−f)·N⌉ of all active apps; a
    # satisfied app in the top k bids for nothing); "hungry" ranks only apps with unmet demand.
    filter_over: str = "active"
    # GPUs no PF bundle claimed (the bidders' demand is met): "reauction" offers them at once to the next
    # top 1−f of the apps not yet auctioned this round (they are still free — a resource-available event,
    # Themis §3.3.2; L of pseudocode line 10 is only the hidden payments); "leftover" hands them out at random
    # with L (pseudocode line 21 applied to everything unassigned).
    unclaimed: str = "reauction"
    # Filter rank of an app holding nothing, whose ρ_current is ρ_cap (the paper's ∞): "fair_share" ranks
    # it at the finite ρ it would reach on a 1/N_avg share of the cluster from now — about 1 on arrival,
    # growing without bound as it waits (Themis §3.3.2) — so starving apps compete with holding apps on one
    # scale; "cap" ranks every such app first, ties by arrival (Themis §3.3.2 read literally: under contention
    # the filter turns FIFO among starving apps and an app holding a sliver never bids again).
    starving_rank: str = "fair_share"
    # At lease end an App holds nothing and bids afresh (Themis §3.3.2); the paper does not say which GPUs
    # it then gets. true: the GPUs it held, wherever they place it no worse for its slowdown than the best
    # fit (no checkpoint and restart for nothing); false: placed as a newcomer would be.
    renew_in_place: bool = True
    # Which apps the round's leftover GPUs go to first: "random" (Themis Pseudocode 1 line 21), or "holders"
    # (Tessera's): an app whose lease just ended gets back, before any random hand-out, the leftover GPUs
    # it held, so a holding that no auction wanted is renewed rather than moved to a random app (every move
    # costs both apps a checkpoint and restart).
    leftover_order: str = "random"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fairness_knob <= 1.0:
            raise ValueError(f"fairness_knob f must be in [0, 1], got {self.fairness_knob}")
        if not self.lease_s > 0:
            raise ValueError(f"lease_s must be positive, got {self.lease_s}")
        if self.rho_cap <= 1:
            raise ValueError(f"rho_cap must be > 1, got {self.rho_cap}")
        if self.tid_mode not in ("paper", "exact"):
            raise ValueError(f"tid_mode must be 'paper' or 'exact', got {self.tid_mode!r}")
        if self.solver not in ("auto", "exact", "greedy"):
            raise ValueError(f"solver must be 'auto', 'exact' or 'greedy', got {self.solver!r}")
        if self.min_keep < 0:
            raise ValueError(f"min_keep must be >= 0, got {self.min_keep}")
        if self.filter_over not in ("active", "hungry"):
            raise ValueError(f"filter_over must be 'active' or 'hungry', got {self.filter_over!r}")
        if self.unclaimed not in ("reauction", "leftover"):
            raise ValueError(f"unclaimed must be 'reauction' or 'leftover', got {self.unclaimed!r}")
        if self.leftover_order not in ("random", "holders"):
            raise ValueError(f"leftover_order must be 'random' or 'holders', got {self.leftover_order!r}")
        if self.starving_rank not in ("fair_share", "cap"):
            raise ValueError(f"starving_rank must be 'fair_share' or 'cap', got {self.starving_rank!r}")


def participants(n_active: int, f: float) -> int:
    """k = max(1, ⌈(1 − f)·N⌉): f = 0 → all, f = 1 → exactly one (Themis §4.2.2 knob; ceiling: Tessera's)."""
    if n_active <= 0:
        return 0
    return max(1, math.ceil((1.0 - f) * n_active - 1e-9))


def filter_apps(ranked: Sequence[tuple[float, AppState]], f: float) -> list[AppState]:
    """The top 1−f apps by current ρ, highest first; ties go to the earlier arrival."""
    order = sorted(ranked, key=lambda ra: (-ra[0], ra[1].arrival, ra[1].app_id))
    return [a for _, a in order[: participants(len(order), f)]]


def allocate_leftover(
    cluster: Cluster,
    leftover: Sequence[str],
    first: Sequence[AppState],
    second: Sequence[AppState],
    already: dict[str, list[str]],
    rng: random.Random,
    homes: Sequence[Home] = (),
    holders_first: bool = False,
) -> dict[str, list[str]]:
    """Hand leftover GPUs to apps at random (Themis Pseudocode 1 line 21; order: Tessera's).

    Apps in `first` (the unfiltered) are visited in random order, each taking what it can still use,
    packed next to its GPUs; then `second` (the filtered) the same way. A GPU stays idle only when no app
    has unmet demand, so the round is work-conserving (invariant §6.6-4). With `holders_first`, before
    that, each App whose lease just ended (its `homes` entry) takes back the leftover GPUs it held.
    """
    pool = FreePool(cluster, leftover, homes)
    out: dict[str, list[str]] = {}
    if holders_first:
        # What an App held and no auction claimed goes back to it first (Apps in random order).
        apps = {a.app_id: a for a in [*first, *second]}
        returning = [h for h in homes if h.owner in apps]
        rng.shuffle(returning)
        for h in returning:
            a = apps[h.owner]
            have = [*already.get(a.app_id, []), *out.get(a.app_id, [])]
            mine = [g for g in pool.ids() if g in h.gpus]
            want = min(a.demand_max - len(a.held) - len(have), len(mine))
            if want <= 0:
                continue
            got = pool.take(Anchor.of(cluster, [*a.held, *have]), want, owner=a.app_id)
            out[a.app_id] = [*out.get(a.app_id, []), *got]
    for group in (first, second):
        order = list(group)
        rng.shuffle(order)
        for a in order:
            if not pool.size:
                return out
            have = [*already.get(a.app_id, []), *out.get(a.app_id, [])]
            want = a.demand_max - len(a.held) - len(have)
            if want <= 0:
                continue
            anchor = Anchor.of(cluster, [*a.held, *have])
            got = pool.take(anchor, min(want, pool.size), owner=a.app_id)
            out[a.app_id] = [*out.get(a.app_id, []), *got]
    return out


class Themis:
    """Finish-time fair policy: filter → bids → partial-allocation auction → leftover, under leases."""

    name = "themis"

    def __init__(self, config: ThemisConfig | None = None) -> None:
        self.config = config or ThemisConfig()

    @property
    def lease_s(self) -> float:
        return self.config.lease_s

    def current_rho(self, app: AppState, now: float, cluster: Cluster) -> float:
        """ρ_current from the app's valuation of what it holds (the cached-table rule of §2.6: the
        ARBITER evaluates the table itself, so an app cannot inflate its rank)."""
        return self._bid(app, now, cluster, 0).rho_old

    def rank_rho(self, app: AppState, now: float, cluster: Cluster) -> float:
        """The filter's ranking value: ρ_current, except that an app holding nothing (ρ_cap) is ranked,
        under `starving_rank: fair_share`, at (elapsed + remaining time on min(demand, R_C/N_avg) GPUs) /
        T_id. T_id is the time on a 1/N_avg share, so a newcomer ranks at ≈ 1 and its rank grows with
        waiting. Its bid still values holding nothing at ρ_cap, so once filtered in it wins decisively."""
        bid = self._bid(app, now, cluster, 0)
        r = bid.rho_old
        if r < self.config.rho_cap or self.config.starving_rank == "cap" or app.demand_max <= 0:
            return r
        share = max(1, min(app.demand_max, round(len(cluster) / max(1.0, app.n_avg))))
        remaining = app.estimator.remaining_time(share, 1.0)
        return (bid.elapsed + remaining) / bid.tid if math.isfinite(remaining) else r

    def _bid(self, app: AppState, now: float, cluster: Cluster, offered: int) -> Bid:
        c = self.config
        return make_bid(app, now, cluster, offered, rho_cap=c.rho_cap, tid_mode=c.tid_mode)

    def allocate(
        self,
        now: float,
        apps: Sequence[AppState],
        cluster: Cluster,
        free: Sequence[str],
        rng: random.Random,
    ) -> RoundDecision:
        c = self.config
        decision = RoundDecision()
        hungry = [a for a in apps if a.unmet > 0]
        if not free or not hungry:
            return decision
        population = hungry if c.filter_over == "hungry" else list(apps)
        homes = renewal_homes(apps) if c.renew_in_place else []
        ranked = [(self.rank_rho(a, now, cluster), a) for a in population]
        offer = list(free)
        won: dict[str, list[str]] = {}
        leftover: list[str] = []
        chosen: set[str] = set()
        passes: list[dict[str, Any]] = []
        candidates = ranked
        while offer and candidates:
            # Top 1−f by ρ_current; apps with nothing left to ask for take a filter seat but do not bid.
            filtered = [a for a in filter_apps(candidates, c.fairness_knob) if a.unmet > 0]
            chosen.update(a.app_id for a in filter_apps(candidates, c.fairness_knob))
            bids = [self._bid(a, now, cluster, len(offer)) for a in filtered]
            result = run_auction(
                bids,
                cluster,
                offer,
                solver=c.solver,
                exact_limit=c.exact_limit,
                min_keep=c.min_keep,
                homes=homes,
            )
            won.update(result.won)
            in_pf = {g for gs in result.pf.values() for g in gs}
            leftover.extend(g for g in result.leftover if g in in_pf)  # hidden payments (line 10)
            offer = [g for g in result.leftover if g not in in_pf]
            passes.append(_record(now, len(population), bids, result, {}))
            if c.unclaimed == "leftover":
                break
            candidates = [(r, a) for r, a in ranked if a.app_id not in chosen and a.unmet > 0]
        leftover.extend(offer)
        leftover = cluster.sorted(leftover)
        unfiltered = [a for a in hungry if a.app_id not in chosen]
        bidders = [a for a in hungry if a.app_id in chosen]
        extra = allocate_leftover(
            cluster,
            leftover,
            unfiltered,
            bidders,
            won,
            rng,
            homes,
            holders_first=c.leftover_order == "holders",
        )
        expiry = lease_expiry(now, c.lease_s)
        for app_id, gpus in won.items():
            if gpus:
                decision.grants.append(Grant(app_id, tuple(gpus), expiry, "auction"))
        for app_id, gpus in extra.items():
            if gpus:
                decision.grants.append(Grant(app_id, tuple(gpus), expiry, "leftover"))
        decision.record = {**passes[0], "passes": len(passes), "later_passes": passes[1:]}
        decision.record["leftover_grants"] = {k: list(v) for k, v in extra.items()}
        log.debug(
            "themis round t=%.0f: %d passes, %d offered, %d leftover",
            now,
            len(passes),
            len(free),
            len(leftover),
        )
        return decision


def renewal_homes(apps: Sequence[AppState]) -> list[Home]:
    """The GPUs each App held until its lease ended this instant, with its slowdown by locality."""
    return [Home(a.app_id, a.previous, a.sensitivity.slowdown) for a in apps if a.previous and a.unmet > 0]


def _record(
    now: float,
    n_active: int,
    bids: Sequence[Bid],
    result: Any,
    extra: dict[str, list[str]],
) -> dict[str, Any]:
    """The record of one auction round (bid tables are summarised by their row count to stay small)."""
    return {
        "now": now,
        "active": n_active,
        "solver": result.solver,
        "participants": [
            {
                "app": b.app_id,
                "rho_current": b.rho_old,  # the bid's ρ(held), not the filter rank
                "bid_rows": len(b._memo) + 1,
                "pf": list(result.pf[b.app_id]),
                "payment": result.payment[b.app_id],
                "won": list(result.won[b.app_id]),
            }
            for b in bids
        ],
        "leftover": list(result.leftover),
        "leftover_grants": {k: list(v) for k, v in extra.items()},
    }


def admit(requested_gpus: int, outstanding_gpus: int, cluster_gpus: int, threshold: float | None) -> bool:
    """Admission control (Themis §3.3, footnote 2): reject an app if the aggregate GPUs requested would
    cross threshold × cluster size. None disables it (the paper's experiments run without it)."""
    if threshold is None:
        return True
    if threshold <= 0:
        raise ValueError(f"admission threshold must be positive, got {threshold}")
    return outstanding_gpus + requested_gpus <= threshold * cluster_gpus
