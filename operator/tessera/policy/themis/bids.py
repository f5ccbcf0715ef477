"""Bids: an app's valuation table ρ(G) over placement-equivalence classes of the offer (Themis §4.2.2).

A row is (k more GPUs, locality of held ∪ G) → ρ. When ρ depends only on the count and the locality
level — true for Eq. 1 and Eq. 2 with S(G) = S(locality) (Themis Appendix) — this table is exact,
and it has at most cap × 5 rows instead of 2^|R|. Rows are computed lazily and memoised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.cluster import Cluster, Locality
from tessera.cluster.pool import Anchor
from tessera.policy.themis.estimate import TidMode, rho, t_id
from tessera.policy.training import AppState


@dataclass(slots=True)
class Bid:
    app: AppState
    held: Anchor
    cap: int  # most GPUs this bid can take from the offer
    elapsed: float
    tid: float
    rho_cap: float
    _memo: dict[tuple[int, Locality], float] = field(default_factory=dict)

    @property
    def app_id(self) -> str:
        return self.app.app_id

    def rho(self, k: int, locality: Locality) -> float:
        """ρ if the app got k more GPUs and held ∪ G had this locality."""
        key = (k, locality)
        v = self._memo.get(key)
        if v is None:
            gpus = self.held.count + k
            remaining = self.app.estimator.remaining_time(gpus, self.app.sensitivity.slowdown(locality))
            v = rho(self.elapsed, remaining, self.tid, self.rho_cap)
            self._memo[key] = v
        return v

    def log_rho(self, k: int, locality: Locality) -> float:
        return math.log(max(self.rho(k, locality), 1e-300))

    @property
    def rho_old(self) -> float:
        """The empty row: ρ with what the app already holds."""
        return self.rho(0, self.held.locality())

    def rows(self) -> list[tuple[int, str, float]]:
        """The whole table (for the auction record and tests): (k, locality name, ρ)."""
        out = [(0, self.held.locality().name, self.rho_old)]
        for k in range(1, self.cap + 1):
            for loc in Locality:
                if self.held.count + k > 1 and loc == Locality.GPU:
                    continue
                if self.held.count + k <= 1 and loc != Locality.GPU:
                    continue
                out.append((k, loc.name, self.rho(k, loc)))
        return out


def make_bid(
    app: AppState,
    now: float,
    cluster: Cluster,
    offered: int,
    *,
    rho_cap: float = 1e6,
    tid_mode: TidMode = "paper",
) -> Bid:
    """The AGENT's bid for an offer of `offered` GPUs (Eq. 1 / Eq. 2 through the app's estimator)."""
    tid = t_id(app.total_work, len(cluster), app.app_demand_max, app.n_avg, tid_mode)
    return Bid(
        app=app,
        held=Anchor.of(cluster, app.held),
        cap=min(app.unmet, offered),
        elapsed=max(0.0, now - app.arrival),
        tid=max(tid, 1e-9),
        rho_cap=rho_cap,
    )
