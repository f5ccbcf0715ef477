"""The loop every greedy baseline shares (Themis §6.1 baselines; the shared loop is Tessera's choice).

    while free GPUs remain and some app has unmet demand:
        score each app; give the next GPU — or the best-placed gang — to the top-scoring app

Each baseline only defines its score, its step (one GPU or the whole unmet gang) and its GPU-choice rule:

* ``tight`` — the best-placed GPUs next to what the app holds (the shared `FreePool` packing). Spec §4.1:
  only Gandiva (placement preference), SRTF (remaining time with the offered GPUs: better packing shortens
  it) and Optimus (throughput) look at placement.
* ``any`` — placement-unaware: whichever free GPUs come first in cluster order (Tiresias, SLAQ, SRSF, DRF).
* ``random`` — placement-unaware, free GPUs in a random order (drawn from the round's seeded rng).

Each class sets the paper's rule as its default; ``placement=`` overrides it (scenario key ``placement``).
Every policy gets the same lease, so only the allocation rule differs (Tessera's choice; §6.1 leaves it open).
"""

from __future__ import annotations

import abc
import math
import random
from collections.abc import Sequence
from typing import Literal

from tessera.cluster import Cluster
from tessera.cluster.pool import Anchor, FreePool
from tessera.policy.training import AppState, Grant, RoundDecision, lease_expiry

PlacementRule = Literal["tight", "any", "random"]
PLACEMENTS: tuple[PlacementRule, ...] = ("tight", "any", "random")


class GreedyPolicy(abc.ABC):
    name = "greedy"
    step: Literal["gpu", "gang"] = "gang"
    placement: PlacementRule = "tight"

    def __init__(self, lease_s: float = 600.0, placement: str | None = None) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.lease_s = lease_s
        if placement is not None:
            if placement not in PLACEMENTS:
                raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
            self.placement = placement

    @abc.abstractmethod
    def score(
        self, app: AppState, given: int, anchor: Anchor, pool: FreePool, now: float, cluster: Cluster
    ) -> float:
        """Higher is served first. `given` GPUs were already handed to the app this round."""

    def allocate(
        self,
        now: float,
        apps: Sequence[AppState],
        cluster: Cluster,
        free: Sequence[str],
        rng: random.Random,
    ) -> RoundDecision:
        pool = FreePool(cluster, free)
        given: dict[str, list[str]] = {}
        anchors = {a.app_id: Anchor.of(cluster, a.held) for a in apps if a.unmet > 0}
        live = [a for a in apps if a.unmet > 0]
        in_order = cluster.sorted(free)
        if self.placement == "random":
            rng.shuffle(in_order)
        while pool.size and live:
            best = max(
                live,
                key=lambda a: (
                    self.score(a, len(given.get(a.app_id, ())), anchors[a.app_id], pool, now, cluster),
                    -a.arrival,
                ),
            )
            have = given.setdefault(best.app_id, [])
            want = best.unmet - len(have)
            d = min(want if self.step == "gang" else 1, pool.size)
            if self.placement == "tight":
                got = pool.take(anchors[best.app_id], d, grow_to=want)
            else:
                free_now = set(pool.ids())
                got = [g for g in in_order if g in free_now][:d]
                pool.remove(got)
            have.extend(got)
            anchors[best.app_id].add(cluster, got)
            if len(have) >= best.unmet:
                live.remove(best)
        expiry = lease_expiry(now, self.lease_s)
        return RoundDecision(grants=[Grant(k, tuple(v), expiry, "greedy") for k, v in given.items() if v])


def best_slowdown(app: AppState, anchor: Anchor, pool: FreePool, d: int) -> float:
    """S of the app's gang if it got d more GPUs placed as tightly as the pool allows now."""
    loc = pool.predict(anchor, max(1, min(d, pool.size)))
    return app.sensitivity.slowdown(loc if loc is not None else anchor.locality())


def throughput(gpus: int, demand: int, slowdown: float) -> float:
    return min(gpus, demand) / slowdown if gpus > 0 else 0.0


def safe_ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf
