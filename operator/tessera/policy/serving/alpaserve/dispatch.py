"""Run-time dispatch: shortest queue across the groups holding a model, FCFS pipelines, SLO admission.

Paper §4.3 (L3170–L3182, spec §3.1): the controller sends each request to the group with the shortest
queue; the group rejects it if it cannot finish within its SLO even if scheduled now (L2651–L2653).
Queue length is the group's predicted drain time (its last-stage clock), the measure REF's fast
simulator uses, so the planner's simulator and the router agree (spec §7.3). Ties go to the lowest group.

Per-stage clocks implement the FCFS pipeline exactly (spec §3.3): request r starts stage k once it has
left stage k−1 and the previous admitted request has left stage k. A rejected request changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tessera.policy.serving.alpaserve.placement import Placement
from tessera.policy.serving.alpaserve.profiles import ModelProfile

NO_REPLICA = -1


class ShortestQueueDispatcher:
    """Stateful router for one placement. ``dispatch`` is called in arrival order."""

    def __init__(
        self,
        placement: Placement,
        profiles: Mapping[str, ModelProfile],
        *,
        fixed_overhead_s: float = 0.0,
        device_free_at: Mapping[int, float] | None = None,
    ) -> None:
        if fixed_overhead_s < 0:
            raise ValueError("fixed_overhead_s must be non-negative")
        self.placement = placement
        self.fixed_overhead_s = fixed_overhead_s
        self._candidates: dict[str, list[int]] = {}
        # per group, per model: (stage latencies, non-blocking delays after each stage)
        self._lat: list[dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = []
        self.clocks: list[list[float]] = []
        free = device_free_at or {}
        for gi, g in enumerate(placement.groups):
            table: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {}
            for m in g.models:
                sp = profiles[m].stages(g.config)
                comm = (*sp.stage_comm_s, 0.0) if sp.stage_comm_s else (0.0,) * sp.pp
                table[m] = (sp.stage_latency_s, comm)
                self._candidates.setdefault(m, []).append(gi)
            self._lat.append(table)
            # carrying over busy devices from a previous placement (Clockwork++ switches)
            self.clocks.append(
                [max((free.get(d, 0.0) for d in g.stage_devices(k)), default=0.0) for k in range(g.config.pp)]
            )

    def candidates(self, model: str) -> list[int]:
        return self._candidates.get(model, [])

    def dispatch(self, arrival: float, model: str, slo: float) -> tuple[int, float]:
        """Route one request. Returns ``(group, finish)``: group ``NO_REPLICA`` if no group holds the
        model; finish ``inf`` if the chosen group rejects it (it would miss ``arrival + slo``)."""
        cands = self._candidates.get(model)
        if not cands:
            return NO_REPLICA, math.inf
        clocks = self.clocks
        gi = cands[0]
        if len(cands) > 1:
            best = clocks[gi][-1]
            for c in cands[1:]:
                v = clocks[c][-1]
                if v < best:
                    best, gi = v, c
        lat, comm = self._lat[gi][model]
        clock = clocks[gi]
        t = arrival
        done: list[float] = []
        for k in range(len(lat)):
            ck = clock[k]
            t = (ck if ck > t else t) + lat[k]
            done.append(t)
            t += comm[k]
        finish = t + self.fixed_overhead_s
        if finish - arrival > slo:
            return gi, math.inf
        clock[:] = done
        return gi, finish

    def device_free_at(self) -> dict[int, float]:
        """When each device finishes its admitted work (to carry state into a new placement)."""
        out: dict[int, float] = {}
        for g, clock in zip(self.placement.groups, self.clocks, strict=True):
            for k, c in enumerate(clock):
                for d in g.stage_devices(k):
                    out[d] = c
        return out
