"""Run-time dispatch: shortest queue across the groups holding a model, FCFS pipelines, SLO admission.

AlpaServe §4.3: the controller sends each request to the group with the shortest
queue; the group rejects it if it cannot finish within its SLO even if scheduled now (§3.2).
Queue length is the group's predicted drain time (its last-stage clock), the measure the fast
simulator in the authors' code uses, so the planner's simulator and the router agree. Ties go to the lowest group.

Per-stage clocks implement the FCFS pipeline exactly (AlpaServe §5): request r starts stage k once it has
left stage k−1 and the previous admitted request has left stage k. A rejected request changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from tessera.policy.serving.alpaserve.placement import ModelPlacement
from tessera.policy.serving.alpaserve.profiles import ModelProfile

NO_REPLICA = -1
# a candidate group of a model while replaying: group, stage latencies, transfer delays (None if all 0),
# the stage recurrence
_Entry = tuple[int, tuple[float, ...], tuple[float, ...] | None, "Stepper"]


# One request through an FCFS pipeline whose stage clocks are ``c``: x_k = max(c_k, x_{k-1}) + lat_k with
# x_{-1} = arrival (AlpaServe §5), plus the transfer delay after stage k where there is one. Each returns
# the new clocks and the time the request leaves the last stage. Written out for 1, 2, 4 and 8 stages
# without delays (the pipeline depths the search enumerates) so no per-stage loop runs.
Stepper = Callable[
    [float, Sequence[float], Sequence[float], Sequence[float] | None], tuple[tuple[float, ...], float]
]


def _step_loop(
    t: float, c: Sequence[float], lat: Sequence[float], comm: Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    x = t
    done = []
    for k in range(len(lat)):
        ck = c[k]
        x = (ck if ck > x else x) + lat[k]
        done.append(x)
        if comm is not None:
            x += comm[k]
    return tuple(done), x


def _step1(
    t: float, c: Sequence[float], lat: Sequence[float], comm: Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    c0 = c[0]
    x = (c0 if c0 > t else t) + lat[0]
    return (x,), x


def _step2(
    t: float, c: Sequence[float], lat: Sequence[float], comm: Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    c0, c1 = c
    l0, l1 = lat
    x0 = (c0 if c0 > t else t) + l0
    x = (c1 if c1 > x0 else x0) + l1
    return (x0, x), x


def _step4(
    t: float, c: Sequence[float], lat: Sequence[float], comm: Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    c0, c1, c2, c3 = c
    l0, l1, l2, l3 = lat
    x0 = (c0 if c0 > t else t) + l0
    x1 = (c1 if c1 > x0 else x0) + l1
    x2 = (c2 if c2 > x1 else x1) + l2
    x = (c3 if c3 > x2 else x2) + l3
    return (x0, x1, x2, x), x


def _step8(
    t: float, c: Sequence[float], lat: Sequence[float], comm: Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    l0, l1, l2, l3, l4, l5, l6, l7 = lat
    x0 = (c0 if c0 > t else t) + l0
    x1 = (c1 if c1 > x0 else x0) + l1
    x2 = (c2 if c2 > x1 else x1) + l2
    x3 = (c3 if c3 > x2 else x2) + l3
    x4 = (c4 if c4 > x3 else x3) + l4
    x5 = (c5 if c5 > x4 else x4) + l5
    x6 = (c6 if c6 > x5 else x5) + l6
    x = (c7 if c7 > x6 else x6) + l7
    return (x0, x1, x2, x3, x4, x5, x6, x), x


_UNROLLED: dict[int, Stepper] = {1: _step1, 2: _step2, 4: _step4, 8: _step8}


def stepper(pp: int, comm: Sequence[float] | None) -> Stepper:
    """The recurrence for a ``pp``-stage pipeline (``comm`` None: no transfer delays)."""
    return _step_loop if comm is not None else _UNROLLED.get(pp, _step_loop)


def advance(
    arrival: float, clock: Sequence[float], lat: Sequence[float], comm: Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    """One request through an FCFS pipeline with stage clocks ``clock``: the new clocks and the time it
    leaves the last stage (before ``fixed_overhead_s``). Same operations as ``replay``."""
    return stepper(len(lat), comm)(arrival, clock, lat, comm)


class ShortestQueueDispatcher:
    """Stateful router for one placement. ``dispatch`` is called in arrival order."""

    def __init__(
        self,
        placement: ModelPlacement,
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

    def replay(
        self, arrivals: Sequence[float], models: Sequence[str], slos: Sequence[float]
    ) -> tuple[list[int], list[float], list[tuple[float, ...] | None]]:
        """``dispatch`` for many requests in arrival order, for the planner's simulator. Returns each
        request's group and finish, and the routed group's stage clocks after admitting it (None when
        rejected or unroutable), which lets the planner resume a replay from any request.

        Same decisions and the same floating-point operations in the same order as ``dispatch``, so the
        results are bit-identical (tests compare the two); only the interpreter's per-request overhead is
        gone: each model's candidate groups, stage tables and recurrence (``stepper``) are looked up once
        and clocks live in tuples while replaying. Zero transfer delays are not added.
        """
        plans = self._plans()
        state = [tuple(c) for c in self.clocks]
        overhead = self.fixed_overhead_s
        inf = math.inf
        out_g: list[int] = []
        out_f: list[float] = []
        out_d: list[tuple[float, ...] | None] = []
        add_g, add_f, add_d = out_g.append, out_f.append, out_d.append
        for t, m, slo in zip(arrivals, models, slos, strict=True):
            cands = plans.get(m)
            if not cands:
                add_g(NO_REPLICA)
                add_f(inf)
                add_d(None)
                continue
            gi, lat, comm, step = cands[0]
            if len(cands) > 1:
                best = state[gi][-1]
                for e in cands:
                    v = state[e[0]][-1]
                    if v < best:
                        best = v
                        gi, lat, comm, step = e
            add_g(gi)
            new, x = step(t, state[gi], lat, comm)
            finish = x + overhead
            if finish - t > slo:
                add_f(inf)
                add_d(None)
            else:
                state[gi] = new
                add_f(finish)
                add_d(new)
        for clock, c in zip(self.clocks, state, strict=True):
            clock[:] = c
        return out_g, out_f, out_d

    def _plans(self) -> dict[str, list[_Entry]]:
        """Per model, its candidate groups with their stage tables and recurrence, looked up once."""
        plans: dict[str, list[_Entry]] = {}
        for m, holders in self._candidates.items():
            entries: list[_Entry] = []
            for gi in holders:
                stage_lat, delays = self._lat[gi][m]
                comm = delays if any(delays) else None
                entries.append((gi, stage_lat, comm, stepper(len(stage_lat), comm)))
            plans[m] = entries
        return plans

    def device_free_at(self) -> dict[int, float]:
        """When each device finishes its admitted work (to carry state into a new placement)."""
        out: dict[int, float] = {}
        for g, clock in zip(self.placement.groups, self.clocks, strict=True):
            for k, c in enumerate(clock):
                for d in g.stage_devices(k):
                    out[d] = c
        return out
