"""Clockwork++ (AlpaServe §6.2, footnote 5): Clockwork with zero-cost re-placement.

At every window boundary the models are re-placed with Selective Replication fitted to that window's
*own* traffic (an oracle, ``SelectiveReplicationReplacement`` in the authors' code) and switched instantly — "a
hypothetical upper bound of Clockwork's performance". Work already admitted keeps its devices busy
across a switch. Windows: 60 s for MAF1, 5.4K s for MAF2 in the paper (21,600 s in the authors' artifact).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.policy.serving.alpaserve.dispatch import ShortestQueueDispatcher
from tessera.policy.serving.alpaserve.placement import MemoryRule, ModelPlacement
from tessera.policy.serving.alpaserve.profiles import ModelProfile
from tessera.policy.serving.alpaserve.simulator import SimStats, simulate
from tessera.policy.serving.alpaserve.workload import Workload
from tessera.policy.serving.baselines.selective_replication import selective_replication


@dataclass(frozen=True)
class Schedule:
    """Placements in force from each window start."""

    starts: tuple[float, ...]
    placements: tuple[ModelPlacement, ...]


def clockwork_pp_schedule(
    profiles: Sequence[ModelProfile],
    num_devices: int,
    workload: Workload,
    budget_bytes: float,
    window_s: float,
    *,
    memory_rule: MemoryRule = "per_stage",
    fixed_overhead_s: float = 0.0,
) -> Schedule:
    """One SR placement per window, each fitted to that window's requests."""
    if window_s <= 0:
        raise ValueError(f"Clockwork++ window must be positive, got {window_s}")
    if len(workload) == 0:
        empty = selective_replication(profiles, num_devices, workload, budget_bytes).placement
        return Schedule((0.0,), (empty,))
    t0 = float(workload.arrivals[0])
    n_win = max(1, math.ceil((float(workload.arrivals[-1]) - t0) / window_s + 1e-12))
    starts, plans = [], []
    for i in range(n_win):
        lo, hi = t0 + i * window_s, t0 + (i + 1) * window_s
        win = workload.window(lo, hi if i < n_win - 1 else math.inf)
        sr = selective_replication(
            profiles,
            num_devices,
            win,
            budget_bytes,
            memory_rule=memory_rule,
            fixed_overhead_s=fixed_overhead_s,
        )
        starts.append(lo if i else -math.inf)
        plans.append(sr.placement)
    return Schedule(tuple(starts), tuple(plans))


def simulate_schedule(
    schedule: Schedule,
    profiles: Sequence[ModelProfile],
    workload: Workload,
    *,
    fixed_overhead_s: float = 0.0,
) -> SimStats:
    """Run the workload through the schedule, switching placements at window starts."""
    by_name = {p.name: p for p in profiles}
    finish = np.full(len(workload), np.inf)
    group = np.full(len(workload), -1, dtype=np.int64)
    free: dict[int, float] = {}
    ends = (*schedule.starts[1:], math.inf)
    for start, end, plm in zip(schedule.starts, ends, schedule.placements, strict=True):
        mask = (workload.arrivals >= start) & (workload.arrivals < end)
        d = ShortestQueueDispatcher(plm, by_name, fixed_overhead_s=fixed_overhead_s, device_free_at=free)
        win = Workload(
            workload.model_names, workload.arrivals[mask], workload.models[mask], workload.slos[mask]
        )
        st = simulate(plm, by_name, win, dispatcher=d)
        finish[mask], group[mask] = st.finish, st.group
        free = d.device_free_at()
    n_groups = max((len(p.groups) for p in schedule.placements), default=0)
    return SimStats(workload, finish, group, n_groups)
