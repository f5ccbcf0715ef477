"""The placement simulator: the planner's objective (AlpaServe §5).

FCFS without batching needs no event queue: one pass over requests in arrival order through the
run-time dispatcher (the same code the router runs) is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.policy.serving.alpaserve.dispatch import NO_REPLICA, ShortestQueueDispatcher
from tessera.policy.serving.alpaserve.placement import ModelPlacement
from tessera.policy.serving.alpaserve.profiles import ModelProfile
from tessera.policy.serving.alpaserve.workload import Workload


@dataclass(frozen=True)
class SimStats:
    """Outcome of one simulation. ``finish`` is inf for requests that were not served in time."""

    workload: Workload
    finish: npt.NDArray[np.float64]
    group: npt.NDArray[np.int64]  # routed group, NO_REPLICA when no group holds the model
    num_groups: int

    @property
    def good(self) -> npt.NDArray[np.bool_]:
        return np.isfinite(self.finish)

    @property
    def attainment(self) -> float:
        """SLO attainment: share of all requests served within SLO (AlpaServe §4.2, counted over all requests as the authors' code does)."""
        n = len(self.finish)
        return float(self.good.sum() / n) if n else 1.0

    @property
    def latencies(self) -> npt.NDArray[np.float64]:
        g = self.good
        return self.finish[g] - self.workload.arrivals[g]

    @property
    def mean_latency(self) -> float:
        lat = self.latencies
        return float(lat.mean()) if len(lat) else math.inf

    def per_model_requests(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.workload.models, minlength=len(self.workload.model_names))

    def per_model_good(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.workload.models[self.good], minlength=len(self.workload.model_names))

    def per_group_requests(self) -> npt.NDArray[np.int64]:
        routed = self.group[self.group != NO_REPLICA]
        return np.bincount(routed, minlength=self.num_groups)

    def per_group_good(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.group[self.good], minlength=self.num_groups)

    def score(self, num_replicas: int) -> float:
        """The authors' code's beam tie-break: attainment, then lower mean latency, then more replicas (Algorithm 1's beam, §4.2)."""
        mean = self.mean_latency if math.isfinite(self.mean_latency) else 1e3
        return self.attainment - mean / 1e4 + num_replicas / 1e6


def simulate(
    placement: ModelPlacement,
    profiles: Mapping[str, ModelProfile],
    workload: Workload,
    *,
    fixed_overhead_s: float = 0.0,
    dispatcher: ShortestQueueDispatcher | None = None,
) -> SimStats:
    """Replay ``workload`` against ``placement``; a fresh dispatcher unless one is passed in."""
    d = dispatcher or ShortestQueueDispatcher(placement, profiles, fixed_overhead_s=fixed_overhead_s)
    names = workload.model_names
    models = [names[i] for i in workload.models.tolist()]
    group, finish, _ = d.replay(workload.arrivals.tolist(), models, workload.slos.tolist())
    return SimStats(
        workload, np.array(finish, dtype=np.float64), np.array(group, dtype=np.int64), len(placement.groups)
    )


def simulate_reference(
    placement: ModelPlacement,
    profiles: Mapping[str, ModelProfile],
    workload: Workload,
    *,
    fixed_overhead_s: float = 0.0,
) -> SimStats:
    """``simulate`` one ``dispatch`` call per request, as the router runs it: the reference the faster
    paths (``ShortestQueueDispatcher.replay``, the planner's per-component cache) are tested against."""
    d = ShortestQueueDispatcher(placement, profiles, fixed_overhead_s=fixed_overhead_s)
    names = workload.model_names
    n = len(workload)
    finish = np.empty(n, dtype=np.float64)
    group = np.empty(n, dtype=np.int64)
    for i, (t, mi, slo) in enumerate(
        zip(workload.arrivals.tolist(), workload.models.tolist(), workload.slos.tolist(), strict=True)
    ):
        group[i], finish[i] = d.dispatch(t, names[mi], slo)
    return SimStats(workload, finish, group, len(placement.groups))
