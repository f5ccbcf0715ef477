"""Partitioning models over scheduler shards / sub-clusters, Symphony §4.4 and Appendix A.

The paper solves a MILP with CPLEX (time-boxed to 10 s): minimise ``ΔR + w·ΔS`` — the largest deviation
of a partition's request rate and static memory from their averages — subject to a rate cap R_max (4),
a memory cap ``Σ s_i + max d_i ≤ S_max`` (5), every model in exactly one partition (8), and, when a
previous assignment exists, a disruption budget ``Σ c_i·[moved i] ≤ C_max`` (10).

No MILP solver is a dependency here, so this is a documented greedy with the same objective and
constraints: longest-processing-time first (models by descending normalised size ``r_i/R̄ + w·s_i/S̄``,
each into the feasible partition with the smallest normalised load), then local search over single
moves out of / into the most and least loaded partitions and swaps between them while the objective falls. From a
previous assignment only the local search runs, and it stops before the moves would exceed C_max.
:func:`random_partition` is the paper's baseline: random feasible partitions, keep the best (Symphony Appendix A.2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardModel:
    """A model to place: request rate r, static memory s, runtime memory d, and its move cost c."""

    name: str
    rate: float
    static_mem: float
    dynamic_mem: float = 0.0
    move_cost: float = 1.0


@dataclass(frozen=True)
class Partition:
    assignment: dict[str, int]
    rates: list[float]
    mems: list[float]
    objective: float

    def imbalance(self) -> tuple[float, float]:
        """(max − min)/avg of load and of memory over partitions, the paper's metric (Symphony Appendix A.2)."""
        return _imb(self.rates), _imb(self.mems)


def _imb(xs: Sequence[float]) -> float:
    avg = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / avg if avg > 0 else 0.0


class _State:
    def __init__(self, models: Sequence[ShardModel], parts: int, w: float) -> None:
        self.models, self.parts, self.w = models, parts, w
        self.rbar = sum(m.rate for m in models) / parts
        self.sbar = sum(m.static_mem for m in models) / parts
        self.where = [-1] * len(models)
        self.r = [0.0] * parts
        self.s = [0.0] * parts
        self.members: list[set[int]] = [set() for _ in range(parts)]

    def objective(self) -> float:
        """(3): ΔR + w·ΔS at the tightest ΔR, ΔS that satisfy (6) and (7)."""
        return max(abs(x - self.rbar) for x in self.r) + self.w * max(abs(x - self.sbar) for x in self.s)

    def pair_objective(self, a: int, b: int, ra: float, sa: float, rb: float, sb: float) -> float:
        """The objective if only partitions a and b change to the given totals: O(1) with the
        top-3 deviations of the others precomputed by :meth:`snapshot`."""
        dr = max((d for d, j in self._top_r if j != a and j != b), default=0.0)
        ds = max((d for d, j in self._top_s if j != a and j != b), default=0.0)
        dr = max(dr, abs(ra - self.rbar), abs(rb - self.rbar))
        ds = max(ds, abs(sa - self.sbar), abs(sb - self.sbar))
        return dr + self.w * ds

    def snapshot(self) -> None:
        self._top_r = sorted(((abs(x - self.rbar), j) for j, x in enumerate(self.r)), reverse=True)[:3]
        self._top_s = sorted(((abs(x - self.sbar), j) for j, x in enumerate(self.s)), reverse=True)[:3]

    def mem_used(self, j: int, add: int | None = None, remove: int | None = None) -> float:
        """Constraint (5)'s left side for partition j, optionally with one model added / removed."""
        idx = self.members[j] - ({remove} if remove is not None else set())
        if add is not None:
            idx = idx | {add}
        return sum(self.models[i].static_mem for i in idx) + max(
            (self.models[i].dynamic_mem for i in idx), default=0.0
        )

    def feasible(
        self, j: int, s_max: float, r_max: float, add: int | None = None, remove: int | None = None
    ) -> bool:
        dr = (self.models[add].rate if add is not None else 0.0) - (
            self.models[remove].rate if remove is not None else 0.0
        )
        if self.r[j] + dr > r_max + 1e-9:
            return False
        return s_max == math.inf or self.mem_used(j, add, remove) <= s_max + 1e-9

    def place(self, i: int, j: int) -> None:
        old = self.where[i]
        if old >= 0:
            self.members[old].discard(i)
            self.r[old] -= self.models[i].rate
            self.s[old] -= self.models[i].static_mem
        self.where[i] = j
        self.members[j].add(i)
        self.r[j] += self.models[i].rate
        self.s[j] += self.models[i].static_mem


def partition_models(
    models: Sequence[ShardModel],
    parts: int,
    *,
    s_max: float = math.inf,
    r_max: float = math.inf,
    w: float = 1.0,
    previous: Mapping[str, int] | None = None,
    c_max: float = math.inf,
    max_rounds: int = 200,
) -> Partition:
    """Assign every model to one of ``parts`` partitions (see the module docstring)."""
    if parts < 1:
        raise ValueError(f"need at least one partition, got {parts}")
    if not models:
        raise ValueError("no models to partition")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError("model names must be unique")
    st = _State(models, parts, w)
    rn = st.rbar if st.rbar > 0 else 1.0
    sn = st.sbar if st.sbar > 0 else 1.0
    budget = c_max
    if previous is None:
        for i in sorted(
            range(len(models)), key=lambda i: -(models[i].rate / rn + w * models[i].static_mem / sn)
        ):
            ok = [j for j in range(parts) if st.feasible(j, s_max, r_max, add=i)]
            if not ok:
                raise ValueError(
                    f"model {models[i].name} fits no partition (rate cap {r_max}, memory cap {s_max}); "
                    "add partitions or raise the caps"
                )
            st.place(i, min(ok, key=lambda j: (st.r[j] / rn + w * st.s[j] / sn, j)))
        budget = math.inf
    else:
        for i, m in enumerate(models):
            j = previous.get(m.name)
            if j is None or not 0 <= j < parts:
                raise ValueError(f"previous assignment has no valid partition for model {m.name}")
            st.place(i, j)
    _local_search(st, s_max, r_max, budget, max_rounds, moved_from=dict(enumerate(st.where)))
    return Partition(
        {m.name: st.where[i] for i, m in enumerate(models)}, list(st.r), list(st.s), st.objective()
    )


def _local_search(
    st: _State, s_max: float, r_max: float, budget: float, max_rounds: int, moved_from: dict[int, int]
) -> None:
    """Best improving move or swap between the extreme partitions, repeated while it helps."""
    search = _Search(st, s_max, r_max, budget, moved_from)
    for _ in range(max_rounds):
        cur = st.objective()
        st.snapshot()
        extremes = {
            max(range(st.parts), key=lambda j: st.r[j]),
            min(range(st.parts), key=lambda j: st.r[j]),
            max(range(st.parts), key=lambda j: st.s[j]),
            min(range(st.parts), key=lambda j: st.s[j]),
        }
        # swaps between extreme partitions help when single moves overshoot
        best = search.best_move(extremes, cur) or search.best_swap(extremes, cur)
        if best is None:
            return
        for i, dst in best[1]:
            st.place(i, dst)
        search.spent += best[2]


# a step of the local search: (objective after, [(model, destination partition)], move cost)
_Step = tuple[float, list[tuple[int, int]], float]


class _Search:
    def __init__(
        self, st: _State, s_max: float, r_max: float, budget: float, moved_from: dict[int, int]
    ) -> None:
        self.st, self.s_max, self.r_max, self.budget, self.moved_from = st, s_max, r_max, budget, moved_from
        self.spent = 0.0

    def cost_of(self, i: int, dest: int) -> float:
        # Moving back to where it started refunds; moving a model already moved costs nothing more.
        was_moved = self.st.where[i] != self.moved_from[i]
        will_move = dest != self.moved_from[i]
        return self.st.models[i].move_cost * (int(will_move) - int(was_moved))

    def best_move(self, extremes: set[int], cur: float) -> _Step | None:
        """The best improving move of one model between an extreme partition and any other."""
        st = self.st
        best: _Step | None = None
        for a in extremes:
            for b in range(st.parts):
                if a == b:
                    continue
                for src, dst in ((a, b), (b, a)):
                    for i in st.members[src]:
                        m = st.models[i]
                        obj = st.pair_objective(
                            src, dst, st.r[src] - m.rate, st.s[src] - m.static_mem,
                            st.r[dst] + m.rate, st.s[dst] + m.static_mem,
                        )  # fmt: skip
                        if obj >= cur - 1e-12 or (best is not None and obj >= best[0]):
                            continue
                        c = self.cost_of(i, dst)
                        if self.spent + c <= self.budget + 1e-9 and st.feasible(
                            dst, self.s_max, self.r_max, add=i
                        ):
                            best = (obj, [(i, dst)], c)
        return best

    def best_swap(self, extremes: set[int], cur: float) -> _Step | None:
        """The best improving swap of two models between two extreme partitions."""
        st, s_max, r_max = self.st, self.s_max, self.r_max
        best: _Step | None = None
        for a in extremes:
            for b in extremes:
                if a == b:
                    continue
                for i in st.members[a]:
                    for k in st.members[b]:
                        mi, mk = st.models[i], st.models[k]
                        dr, ds = mk.rate - mi.rate, mk.static_mem - mi.static_mem
                        obj = st.pair_objective(a, b, st.r[a] + dr, st.s[a] + ds, st.r[b] - dr, st.s[b] - ds)
                        if obj >= cur - 1e-12 or (best is not None and obj >= best[0]):
                            continue
                        c = self.cost_of(i, b) + self.cost_of(k, a)
                        if self.spent + c > self.budget + 1e-9:
                            continue
                        if st.feasible(a, s_max, r_max, add=k, remove=i) and st.feasible(
                            b, s_max, r_max, add=i, remove=k
                        ):
                            best = (obj, [(i, b), (k, a)], c)
        return best


def random_partition(
    models: Sequence[ShardModel],
    parts: int,
    rng: random.Random,
    *,
    tries: int,
    s_max: float = math.inf,
    r_max: float = math.inf,
    w: float = 1.0,
) -> Partition | None:
    """The paper's random-search baseline (Symphony Appendix A.2): ``tries`` uniform random assignments, best feasible."""
    best: Partition | None = None
    for _ in range(tries):
        st = _State(models, parts, w)
        for i in range(len(models)):
            st.place(i, rng.randrange(parts))
        if any(st.r[j] > r_max or st.mem_used(j) > s_max for j in range(parts)):
            continue
        obj = st.objective()
        if best is None or obj < best.objective:
            best = Partition({m.name: st.where[i] for i, m in enumerate(models)}, list(st.r), list(st.s), obj)
    return best
