"""The interface every training-cluster policy implements: Themis and each baseline.

A policy is called on a resource-available event with the apps' state, the cluster and the free GPUs, and
returns grants. It holds no clock and no randomness of its own (`now` and `rng` are parameters), so the
simulator and the operator drive the very same code.

An app describes itself through `AppState`; how it would use k more GPUs is answered by its `Estimator`
(the app's own runtime: a gang-scheduled job, a successive-halving tuner, or any other app scheduler).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tessera.cluster import Cluster, Sensitivity

GrantSource = Literal["auction", "leftover", "greedy"]


class PolicyError(ValueError):
    """Bad input to a training policy (e.g. a GPU granted twice, an unknown app)."""


class Estimator(Protocol):
    """What an app answers about its own future (Themis, NSDI'20, §4.3.1–4.3.2; Fig. 7's JobInfo API)."""

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        """Seconds to finish the remaining work if it held `gpus` GPUs from now on, each job slowed by S.

        `gpus` counts everything the app would hold. 0 GPUs → math.inf.
        """
        ...


@dataclass(frozen=True, slots=True)
class AppState:
    """One active app as a policy sees it at time `now`.

    total_work / remaining_work are serial GPU-seconds (iterations × 1-GPU iteration time);
    attained_service is GPU-seconds held so far; n_avg is the time-weighted number of active apps over
    the app's life, counting itself (Themis §4.3.1's N_avg; averaging over time is Tessera's choice).
    """

    app_id: str
    arrival: float
    demand_max: int
    held: frozenset[str]
    sensitivity: Sensitivity
    total_work: float
    remaining_work: float
    attained_service: float
    n_avg: float
    estimator: Estimator
    network_intensive: bool = False
    peak_demand: int = 0  # app_demand_max over its whole life (T_cluster); 0 = demand_max
    queue: str = "default"  # the team queue it belongs to (tessera.policy.queues)
    # When its current holding began: it last went from no GPU to some (a renewal or a further grant
    # continues the holding). A queue's minimum runtime counts from here.
    since: float = 0.0
    priority: int = 0  # inside its queue, higher priorities are served first (a PriorityClass's value)
    preemptible: bool = True  # False: its GPUs are renewed until it is done, and never reclaimed
    # GPUs whose lease ended at this instant: a round may hand them back (ThemisConfig.renew_in_place).
    previous: frozenset[str] = frozenset()

    @property
    def app_demand_max(self) -> int:
        return max(self.peak_demand, self.demand_max, 1)

    @property
    def unmet(self) -> int:
        return max(0, self.demand_max - len(self.held))

    @property
    def progress(self) -> float:
        return 1.0 - self.remaining_work / self.total_work if self.total_work > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Grant:
    app_id: str
    gpus: tuple[str, ...]
    expiry: float  # lease end; math.inf = held until the app gives them back
    source: GrantSource


@dataclass(slots=True)
class RoundDecision:
    grants: list[Grant] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)  # policy-specific audit trail (auction record)
    # GPUs taken back from apps now (queue reclaim, preemption); they may be granted again in `grants`.
    revoke: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def granted(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for g in self.grants:
            out.setdefault(g.app_id, []).extend(g.gpus)
        return out


class TrainingPolicy(Protocol):
    name: str

    @property
    def lease_s(self) -> float: ...

    def allocate(
        self,
        now: float,
        apps: Sequence[AppState],
        cluster: Cluster,
        free: Sequence[str],
        rng: random.Random,
    ) -> RoundDecision:
        """Decide who gets which of the `free` GPUs. Must never grant a GPU twice or beyond demand_max."""
        ...


def check_decision(decision: RoundDecision, apps: Sequence[AppState], free: Sequence[str]) -> None:
    """Raise PolicyError if a decision breaks the contract (used by the simulator on every round)."""
    free_set = set(free)
    seen: set[str] = set()
    by_id = {a.app_id: a for a in apps}
    lost: dict[str, int] = {}
    for app_id, gpus in decision.revoke.items():
        if app_id not in by_id or not set(gpus) <= by_id[app_id].held:
            raise PolicyError(f"revoked GPUs {gpus} are not all held by {app_id!r}")
        free_set |= set(gpus)
        lost[app_id] = len(set(gpus))
    counts: dict[str, int] = {}
    for g in decision.grants:
        if g.app_id not in by_id:
            raise PolicyError(f"grant to unknown app {g.app_id!r}")
        for gpu in g.gpus:
            if gpu not in free_set:
                raise PolicyError(f"GPU {gpu} granted to {g.app_id} is not free")
            if gpu in seen:
                raise PolicyError(f"GPU {gpu} granted twice in one round")
            seen.add(gpu)
        counts[g.app_id] = counts.get(g.app_id, 0) + len(g.gpus)
    for app_id, n in counts.items():
        a = by_id[app_id]
        if len(a.held) - lost.get(app_id, 0) + n > a.demand_max:
            raise PolicyError(f"{app_id} would hold {len(a.held) + n} GPUs, above its demand {a.demand_max}")


def lease_expiry(now: float, lease_s: float) -> float:
    return now + lease_s if math.isfinite(lease_s) else math.inf
