"""Scoring many placements that differ by one replica, without re-simulating what did not change.

Algorithm 1 and the fast heuristic score a placement, add one replica, score again (AlpaServe §4.2):
the search's cost is almost all simulation (O(S) per candidate, §4.2). The simulation splits
exactly into *components*: groups linked by the models they share. A request for model m only ever looks
at the clocks of the groups holding m, and a group's clocks only move with requests routed to it, so a
component's outcome depends only on its own groups (their configs, models and order, which breaks
shortest-queue ties) and its own models' requests. Adding m to g changes only the component that ends up
holding g; every other component's outcome is reused from the previous candidate.

The outcome arrays assembled from components are equal element for element to one whole simulation
(``simulate``), so scores and therefore the chosen plan are unchanged; tests compare the two.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from tessera.policy.serving.alpaserve.dispatch import NO_REPLICA, ShortestQueueDispatcher, Stepper, stepper
from tessera.policy.serving.alpaserve.placement import Group, ModelPlacement
from tessera.policy.serving.alpaserve.profiles import ModelProfile, ParallelConfig
from tessera.policy.serving.alpaserve.simulator import SimStats
from tessera.policy.serving.alpaserve.workload import Workload

# one group of a component: its index in the placement (tie-break order), devices, config, model set
GroupKey = tuple[int, tuple[int, ...], ParallelConfig, frozenset[str]]
Clocks = tuple[float, ...]
# a run as (request indices, routed groups, finishes, clocks after each), the parts of `_Run`
_MergedRun = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64], list[Clocks | None]]


@dataclass(frozen=True)
class _Run:
    """One component's replay: per request (global index, ascending) the routed group, the finish (inf
    when rejected) and the routed group's clocks after admitting it (None when rejected)."""

    idx: npt.NDArray[np.int64]
    group: npt.NDArray[np.int64]
    finish: npt.NDArray[np.float64]
    done: list[Clocks | None]


class ComponentCache:
    """Simulates ``workload`` against placements, one component at a time, caching components.

    ``simulate(placement, parent=(p, g, m))`` says ``placement`` is ``p`` plus model ``m`` on group
    ``g``; the one component that changed is then replayed incrementally from ``p``'s runs
    (``_resume``). Holds about ``keep`` × |W| cached request outcomes, least recently used dropped first:
    a greedy step reuses the previous candidate's components, a beam step its beam members'.
    """

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        workload: Workload,
        *,
        fixed_overhead_s: float = 0.0,
        keep: int = 8,
        resume: bool = True,
        resume_limit: float = 0.35,
    ) -> None:
        self.profiles = profiles
        self.workload = workload
        self.fixed_overhead_s = fixed_overhead_s
        self.resume = resume
        # give up resuming once this share of a component's requests needed re-dispatching
        self.resume_limit = resume_limit
        self._backoff = self._backoff_left = 0
        names = workload.model_names
        self._index = {m: i for i, m in enumerate(names)}
        order = np.argsort(workload.models, kind="stable")  # request indices grouped by model, in time order
        bounds = np.searchsorted(workload.models[order], np.arange(len(names) + 1))
        self._requests = {m: order[bounds[i] : bounds[i + 1]] for i, m in enumerate(names)}
        self._arrivals = workload.arrivals.tolist()
        self._slos = workload.slos.tolist()
        self._cache: OrderedDict[tuple[GroupKey, ...], _Run] = OrderedDict()
        self._stored = 0
        self._limit = keep * max(len(workload), 1)
        # profiling the search: requests replayed in full, and requests re-evaluated when resuming
        self.replayed = 0
        self.reevaluated = 0

    def simulate(
        self, placement: ModelPlacement, parent: tuple[ModelPlacement, int, str] | None = None
    ) -> SimStats:
        n = len(self.workload)
        finish = np.full(n, np.inf)
        group = np.full(n, NO_REPLICA, dtype=np.int64)
        for comp in _components(placement.groups):
            key = _key(placement, comp)
            run = self._cache.get(key)
            if run is None:
                if self.resume and parent is not None and parent[1] in comp:
                    if self._backoff_left:
                        self._backoff_left -= 1
                    else:
                        run = self._resume(placement, comp, *parent)
                        # after a failed try skip 1, 2, 4, ... tries: where changes spread, resuming only
                        # costs time; the workload's state may change as replicas are added
                        self._backoff = 0 if run is not None else max(1, 2 * self._backoff)
                        self._backoff_left = self._backoff
                if run is None:
                    run = self._replay(placement, comp)
                self._cache[key] = run
                self._stored += len(run.idx)
                while self._stored > self._limit and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._stored -= len(old.idx)
            else:
                self._cache.move_to_end(key)
            group[run.idx] = run.group
            finish[run.idx] = run.finish
        return SimStats(self.workload, finish, group, len(placement.groups))

    def _replay(self, placement: ModelPlacement, comp: list[int]) -> _Run:
        groups = [placement.groups[gi] for gi in comp]
        models = sorted({m for g in groups for m in g.models})
        parts = [self._requests[m] for m in models if m in self._requests]
        idx = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        d = ShortestQueueDispatcher(
            ModelPlacement(tuple(groups)), self.profiles, fixed_overhead_s=self.fixed_overhead_s
        )
        names = self.workload.model_names
        rel, fin, done = d.replay(
            self.workload.arrivals[idx].tolist(),
            [names[i] for i in self.workload.models[idx].tolist()],
            self.workload.slos[idx].tolist(),
        )
        self.replayed += len(idx)
        to_abs = np.array(comp, dtype=np.int64)
        return _Run(idx, to_abs[np.array(rel, dtype=np.int64)], np.array(fin, dtype=np.float64), done)

    def _resume(
        self, placement: ModelPlacement, comp: list[int], parent: ModelPlacement, added_to: int, added: str
    ) -> _Run | None:
        """Replay component ``comp`` of ``placement`` = ``parent`` + ``added`` on group ``added_to``,
        starting from the parent's runs of the components it merges (None if one is no longer cached).

        Walk the requests in arrival order keeping, per group, whether its clocks differ from the
        parent's run at that point ("dirty"). A request whose model is not ``added`` and whose candidate
        groups are all clean is routed and served exactly as in the parent's run, so its outcome is
        copied. Any other request is dispatched afresh; afterwards the group it went to, and the group the
        parent's run sent it to, are compared with the parent's clocks after it and marked clean or dirty.
        Bursty traffic leaves groups idle often, and a group that admits the same request into an idle
        pipeline in both runs is clean again, so few requests are re-dispatched. While no group is dirty
        the walk jumps to the next request for ``added``.
        """
        merged = self._parent_runs(comp, parent, added)
        if merged is None:
            return None
        walk = _Walk(self, placement, comp, added, *merged)
        ok = walk.run()
        self.reevaluated += walk.evaluated
        return walk.result() if ok else None

    def _parent_runs(self, comp: list[int], parent: ModelPlacement, added: str) -> _MergedRun | None:
        """The parent's runs of the components ``comp`` merges, as one run in request order (plus the
        requests for ``added``, unrouted, if no merged component held it); None if one is not cached."""
        members = set(comp)
        parent_runs: list[_Run] = []
        holds_added = False
        for pc in _components(parent.groups):
            if members.isdisjoint(pc):
                continue
            run = self._cache.get(_key(parent, pc))
            if run is None:
                return None
            parent_runs.append(run)
            holds_added = holds_added or any(added in parent.groups[gi].models for gi in pc)
        if not parent_runs:
            return None
        idx_parts = [r.idx for r in parent_runs]
        grp_parts = [r.group for r in parent_runs]
        fin_parts = [r.finish for r in parent_runs]
        done_all: list[Clocks | None] = [d for r in parent_runs for d in r.done]
        if not holds_added and added in self._requests:
            new_req = self._requests[added]
            idx_parts.append(new_req)
            grp_parts.append(np.full(len(new_req), NO_REPLICA, dtype=np.int64))
            fin_parts.append(np.full(len(new_req), np.inf))
            done_all.extend([None] * len(new_req))
        if len(idx_parts) == 1:
            return idx_parts[0], grp_parts[0], fin_parts[0], done_all
        cat = np.concatenate(idx_parts)
        perm = np.argsort(cat, kind="stable")
        pl = perm.tolist()
        old_done = list(itemgetter(*pl)(done_all)) if len(pl) > 1 else [done_all[i] for i in pl]
        return cat[perm], np.concatenate(grp_parts)[perm], np.concatenate(fin_parts)[perm], old_done


# per model (index): the groups of a component holding it, as (local group, stage latencies, stage comms,
# stage recurrence)
_Tables = dict[int, list[tuple[int, tuple[float, ...], tuple[float, ...] | None, Stepper]]]


def _candidate_tables(
    groups: list[Group], profiles: Mapping[str, ModelProfile], index: Mapping[str, int]
) -> tuple[dict[int, int], _Tables]:
    """Per model index, the bit mask of the groups holding it and their stage latencies and comms."""
    cmask: dict[int, int] = {}
    tables: _Tables = {}
    for j, g in enumerate(groups):
        for m in g.models:
            mi = index.get(m)
            if mi is None:
                continue
            cmask[mi] = cmask.get(mi, 0) | (1 << j)
            sp = profiles[m].stages(g.config)
            comm = (*sp.stage_comm_s, 0.0) if sp.stage_comm_s else None
            delays = comm if comm and any(comm) else None
            tables.setdefault(mi, []).append((j, sp.stage_latency_s, delays, stepper(sp.pp, delays)))
    return cmask, tables


class _Walk:
    """One incremental replay (``ComponentCache._resume``): the parent's run of a component, the walk's
    per-group clock state, and the requests re-dispatched so far. Group sets are bit masks over the
    component's local group indices: ``dirty`` (clocks differ from the parent's), ``synced`` (``olds[j]``
    holds the parent's clocks at the walk's position)."""

    def __init__(
        self,
        cache: ComponentCache,
        placement: ModelPlacement,
        comp: list[int],
        added: str,
        idx: npt.NDArray[np.int64],
        old_group: npt.NDArray[np.int64],
        old_finish: npt.NDArray[np.float64],
        old_done: list[Clocks | None],
    ) -> None:
        w = cache.workload
        groups = [placement.groups[gabs] for gabs in comp]
        self.comp, self.idx, self.old_group, self.old_finish, self.old_done = (
            comp, idx, old_group, old_finish, old_done
        )  # fmt: skip
        self.zeros = [(0.0,) * g.config.pp for g in groups]
        self.cmask, self.tables = _candidate_tables(groups, cache.profiles, cache._index)
        self.models_at = w.models[idx].tolist()
        lut = np.full(
            len(placement.groups) + 1, -1, dtype=np.int64
        )  # absolute → local group; NO_REPLICA → -1
        lut[comp] = np.arange(len(comp))
        self.old_local = lut[old_group].tolist()
        self.added_i = cache._index.get(added, -1)
        self.added_at = np.flatnonzero(w.models[idx] == self.added_i).tolist()
        self.admitted_at: dict[int, list[int]] = {}
        self.ev_pos: list[int] = []  # positions re-dispatched, with their new group and finish
        self.ev_group: list[int] = []
        self.ev_finish: list[float] = []
        self.new_done = list(old_done)
        self.olds = list(
            self.zeros
        )  # the parent's clocks per group at the walk's position, valid where synced
        self.news: dict[int, Clocks] = {}  # this run's clocks of the dirty groups
        self.arr, self.slos, self.il = cache._arrivals, cache._slos, idx.tolist()
        self.overhead = cache.fixed_overhead_s
        self.budget = len(self.il) * cache.resume_limit
        self.evaluated = 0

    def run(self) -> bool:
        """Walk the requests; False once re-dispatching passed the budget (a full replay is cheaper)."""
        added_at, models_at, added_i, cmask = self.added_at, self.models_at, self.added_i, self.cmask
        old_done, old_local, olds = self.old_done, self.old_local, self.olds
        n, p, nxt, synced, dirty = len(self.il), 0, 0, 0, 0
        while p < n:
            if not dirty:
                while nxt < len(added_at) and added_at[nxt] < p:
                    nxt += 1
                if nxt == len(added_at):
                    break
                if added_at[nxt] != p:
                    p = added_at[nxt]
                    synced = 0  # skipped requests moved the parent's clocks
            mi = models_at[p]
            if mi != added_i and not cmask[mi] & dirty:
                d = old_done[p]
                if d is not None:  # served as in the parent's run
                    h = old_local[p]
                    olds[h] = d
                    synced |= 1 << h
                p += 1
                continue
            self.evaluated += 1
            if self.evaluated > self.budget:
                return False
            dirty, synced = self._redispatch(p, mi, dirty, synced)
            p += 1
        return True

    def _redispatch(self, p: int, mi: int, dirty: int, synced: int) -> tuple[int, int]:
        """Route request position ``p`` afresh to the shortest queue among its candidate groups, record
        its outcome, and update which groups are dirty; returns (dirty, synced)."""
        cands = self.tables[mi]
        cur: list[Clocks] = []
        for j, _, _, _ in cands:
            if dirty >> j & 1:
                cur.append(self.news[j])
            else:
                if not synced >> j & 1:
                    self.olds[j] = self._old_before(j, p)
                    synced |= 1 << j
                cur.append(self.olds[j])
        gi, lat, comm, step = cands[0]
        c = cur[0]
        if len(cands) > 1:
            best = c[-1]
            for e, ce in zip(cands, cur, strict=True):
                if ce[-1] < best:
                    best = ce[-1]
                    gi, lat, comm, step = e
                    c = ce
        t, slo = self.arr[self.il[p]], self.slos[self.il[p]]
        new, x = step(t, c, lat, comm)
        finish = x + self.overhead
        ok = not finish - t > slo
        self.ev_pos.append(p)
        self.ev_group.append(self.comp[gi])
        self.ev_finish.append(finish if ok else np.inf)
        self.new_done[p] = new if ok else None
        return self._compare(p, gi, new if ok else c, dirty, synced)

    def _compare(self, p: int, gi: int, now_gi: Clocks, dirty: int, synced: int) -> tuple[int, int]:
        """After re-dispatching position ``p`` to local group ``gi`` (clocks now ``now_gi``), mark that
        group and the one the parent's run sent it to clean (same clocks as the parent's) or dirty."""
        olds, news = self.olds, self.news
        h = self.old_local[p]
        d = self.old_done[p]
        for j in (gi, h) if h != gi else (gi,):
            if j < 0:
                continue
            if not synced >> j & 1:
                olds[j] = self._old_before(j, p)
                synced |= 1 << j
            now = now_gi if j == gi else news[j] if dirty >> j & 1 else olds[j]
            then = d if j == h and d is not None else olds[j]
            if now == then:
                dirty &= ~(1 << j)
                news.pop(j, None)
            else:
                dirty |= 1 << j
                news[j] = now
        if d is not None:
            olds[h] = d
        return dirty, synced

    def _old_before(self, j: int, p: int) -> Clocks:
        """Group j's clocks in the parent's run just before request position p (by bisection)."""
        a = self.admitted_at.get(j)
        if a is None:
            admitted = (self.old_group == self.comp[j]) & np.isfinite(self.old_finish)
            a = self.admitted_at[j] = np.flatnonzero(admitted).tolist()
        k = bisect_left(a, p)
        c = self.old_done[a[k - 1]] if k else self.zeros[j]
        assert c is not None
        return c

    def result(self) -> _Run:
        new_group = self.old_group.copy()
        new_finish = self.old_finish.copy()
        new_group[self.ev_pos] = self.ev_group
        new_finish[self.ev_pos] = self.ev_finish
        return _Run(self.idx, new_group, new_finish, self.new_done)


def _key(placement: ModelPlacement, comp: list[int]) -> tuple[GroupKey, ...]:
    gs = placement.groups
    return tuple((gi, gs[gi].devices, gs[gi].config, frozenset(gs[gi].models)) for gi in comp)


def _components(groups: tuple[Group, ...]) -> list[list[int]]:
    """Indices of non-empty groups, split into sets linked by shared models, each in ascending order."""
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    holder: dict[str, int] = {}
    for gi, g in enumerate(groups):
        for m in g.models:
            other = holder.setdefault(m, gi)
            if other != gi:
                a, b = root(other), root(gi)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    comps: dict[int, list[int]] = {}
    for gi, g in enumerate(groups):
        if g.models:
            comps.setdefault(root(gi), []).append(gi)
    return list(comps.values())
