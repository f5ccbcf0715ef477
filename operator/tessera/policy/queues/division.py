"""Division of a cluster's GPUs among team queues, every round (one place; the operator and the simulator
both call `divide`).

Per level of the hierarchy, among siblings:

1. each queue with demand gets up to its guarantee (capped by its demand and its maximum);
2. what is left is shared by weight — weighted max-min fairness on the part above the guarantee, each queue
   capped by its demand and its maximum (KAI's "over-quota weight", Kueue's fair sharing);

then each queue's amount is divided among its children the same way. Amounts are real numbers (a lane is a
fraction of a GPU); `quantize` rounds a division to whole GPUs or lanes without breaking any cap.

Demand is what a queue's objects could use now (GPUs held plus GPUs waited for). A queue's own objects sit
beside its children as an implicit child with no guarantee and weight 1.

Lending limit (Kueue's `lendingLimit`): a queue lends at most `lending_limit` of its unused guarantee, so
`guaranteed − lending_limit` (its reserve) is held for it even while idle. The division counts a queue's
need as at least its reserve; what of the amount given to its subtree its objects and children do not use
(up to the reserve) is held back idle (`Division.reserved`), never handed to siblings. A child's reserve is
part of its parent's subtree, so it is kept from the child's siblings and from everything outside the
parent; a parent's reserve bounds what its whole subtree lends outside it, and any queue inside may use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_EPS = 1e-9


class DivisionError(ValueError):
    """A hierarchy that cannot be divided (an unknown parent, a cycle)."""


@dataclass(frozen=True, slots=True)
class QueueNode:
    """One queue as the division sees it; `parent` None = a top-level queue."""

    name: str
    guaranteed: float = 0.0
    max: float = math.inf
    weight: float = 1.0
    parent: str | None = None
    lending_limit: float = math.inf  # most of the unused guarantee others may borrow; inf: all of it

    @property
    def reserve(self) -> float:
        """The part of the guarantee never lent: guaranteed − lending limit (0 with no limit)."""
        return max(0.0, self.guaranteed - self.lending_limit)


@dataclass(frozen=True, slots=True)
class Division:
    """A division: `shares` as `divide` returns them (what each queue's subtree's objects get), and
    `reserved`, the GPUs held back idle for each queue's own reserve (its subtree's included in no other
    queue's). Shares and reserves together sum to at most the capacity."""

    shares: dict[str, float]
    reserved: dict[str, float]


@dataclass(frozen=True, slots=True)
class _Claim:
    key: str
    guaranteed: float
    cap: float  # min(demand, max)
    weight: float


def water_fill(amount: float, caps: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair split of `amount`: each key gets amount·w/W unless its cap is smaller, in which
    case it gets its cap and the rest is split again among the others."""
    out = dict.fromkeys(caps, 0.0)
    open_keys = {k for k, c in caps.items() if c > _EPS and weights[k] > 0}
    left = amount
    while open_keys and left > _EPS:
        total_w = sum(weights[k] for k in open_keys)
        # Keys whose cap is reached before the others' equal-weight fill level: saturate them first.
        level = left / total_w
        capped = {k for k in open_keys if caps[k] - out[k] <= level * weights[k] + _EPS}
        if not capped:
            for k in open_keys:
                out[k] += level * weights[k]
            break
        for k in capped:
            left -= caps[k] - out[k]
            out[k] = caps[k]
        open_keys -= capped
    return out


def _split(amount: float, claims: Sequence[_Claim]) -> dict[str, float]:
    """One level: guarantees first (scaled down by guarantee when the amount cannot cover them all), then
    the rest by weight above the guarantee."""
    base_caps = {c.key: min(c.guaranteed, c.cap) for c in claims}
    if sum(base_caps.values()) > amount + _EPS:
        return water_fill(amount, base_caps, {c.key: c.guaranteed for c in claims})
    base = base_caps
    extra = water_fill(
        amount - sum(base.values()),
        {c.key: c.cap - base[c.key] for c in claims},
        {c.key: c.weight for c in claims},
    )
    return {k: base[k] + extra[k] for k in base}


def children_of(queues: Sequence[QueueNode]) -> dict[str | None, list[QueueNode]]:
    """Parent name (None = the root) → its child queues, in the given order; raises DivisionError on an
    unknown parent or a cycle."""
    by_name = {q.name: q for q in queues}
    out: dict[str | None, list[QueueNode]] = {None: []}
    for q in queues:
        if q.parent is not None and q.parent not in by_name:
            raise DivisionError(f"queue {q.name!r}: parent {q.parent!r} does not exist")
        out.setdefault(q.parent, []).append(q)
    for q in queues:  # every chain of parents must reach the root
        seen = {q.name}
        p = q.parent
        while p is not None:
            if p in seen:
                raise DivisionError(f"queue {q.name!r}: its parents form a cycle through {p!r}")
            seen.add(p)
            p = by_name[p].parent
    return out


def divide(capacity: float, queues: Sequence[QueueNode], demand: Mapping[str, float]) -> dict[str, float]:
    """GPUs each queue is entitled to now (every queue named, interior ones with their subtree's total).

    `demand[name]` is what the queue's own objects could use; a name absent means none. The result never
    exceeds a queue's demand (subtree) nor its maximum, and sums to at most `capacity` (less what lending
    limits hold back: `divide_with_reserves`).
    """
    return divide_with_reserves(capacity, queues, demand).shares


def divide_with_reserves(
    capacity: float, queues: Sequence[QueueNode], demand: Mapping[str, float]
) -> Division:
    """`divide`, with the GPUs each queue's lending limit holds back idle (see the module's docstring)."""
    kids = children_of(queues)
    subtree: dict[str, float] = {}  # what a queue's subtree claims: its demand, at least its reserve

    def need(q: QueueNode) -> float:
        total = demand.get(q.name, 0.0) + sum(need(c) for c in kids.get(q.name, []))
        subtree[q.name] = min(max(total, q.reserve), q.max)
        return subtree[q.name]

    for q in kids[None]:
        need(q)
    by_name = {q.name: q for q in queues}
    out: dict[str, float] = {}
    reserved: dict[str, float] = {}

    def give(parent: str | None, amount: float) -> float:
        """Divide `amount` inside `parent`; returns what its subtree holds back idle."""
        claims = [_Claim(c.name, c.guaranteed, subtree[c.name], c.weight) for c in kids.get(parent, [])]
        if parent is not None:  # its own objects, beside its children
            claims.append(_Claim("", 0.0, min(demand.get(parent, 0.0), amount), 1.0))
        shares = _split(amount, claims)
        held_back = 0.0
        for c in kids.get(parent, []):
            r = give(c.name, shares[c.name])
            out[c.name] = max(0.0, shares[c.name] - r)
            held_back += r
        if parent is not None:
            # What the subtree leaves unused of its amount is the queue's idle reserve (never more).
            mine = min(max(0.0, amount - sum(shares.values())), by_name[parent].reserve)
            reserved[parent] = mine if mine > _EPS else 0.0
            held_back += reserved[parent]
        return held_back

    give(None, capacity)
    return Division(out, {q.name: reserved.get(q.name, 0.0) for q in queues})


def own_share(queues: Sequence[QueueNode], shares: Mapping[str, float]) -> dict[str, float]:
    """What each queue's own objects get of a `divide` result: a leaf's whole share, an interior queue's
    share less its children's."""
    kids = children_of(queues)
    return {
        q.name: max(0.0, shares.get(q.name, 0.0) - sum(shares.get(c.name, 0.0) for c in kids.get(q.name, [])))
        for q in queues
    }


def headroom(
    queues: Sequence[QueueNode], held: Mapping[str, float], moving_from: str | None = None
) -> dict[str, float]:
    """What the maxima above each queue leave its objects to take: for every ancestor, its maximum less what
    its whole subtree holds (`held`: GPUs each queue's own objects hold); the least of them, inf for a
    top-level queue. A share fits its ancestors' maxima, but what a queue's siblings hold above their
    shares (leases not ended yet) does not: granting a queue its share alone could take a subtree past its
    maximum. For GPUs taken from queue `moving_from`, the ancestors whose subtree holds that queue bound
    nothing (the GPUs stay inside them). Assumes no cycle (`children_of` refuses one)."""
    # Flat queues, the common case: no ancestor bounds anything (reclaim asks once per victim).
    if all(q.parent is None for q in queues):
        return dict.fromkeys((q.name for q in queues), math.inf)
    by_name = {q.name: q for q in queues}
    around: set[str] = set()  # the ancestors of `moving_from`
    p = by_name[moving_from].parent if moving_from in by_name else None
    while p is not None and p in by_name:
        around.add(p)
        p = by_name[p].parent
    subtree = {q.name: held.get(q.name, 0.0) for q in queues}
    for q in queues:  # add each queue's own holding to every ancestor's subtree
        p = q.parent
        while p is not None and p in by_name:
            subtree[p] += held.get(q.name, 0.0)
            p = by_name[p].parent
    out: dict[str, float] = {}
    for q in queues:
        room, p = math.inf, q.parent
        while p is not None and p in by_name:
            if p not in around:
                room = min(room, by_name[p].max - subtree[p])
            p = by_name[p].parent
        out[q.name] = room
    return out


def quantize(
    shares: Mapping[str, float], quantum: float, capacity: float, caps: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Round each share down to a multiple of `quantum` (1 = whole GPUs, 0.1 = tenth-GPU lanes), then hand
    the quanta the flooring freed, one each, to the largest remainders while the total fits `capacity` and
    no share passes its cap (`caps`, e.g. a queue's maximum; a share is never raised above its own value
    rounded up either)."""
    if quantum <= 0:
        raise ValueError(f"quantum must be > 0, got {quantum}")
    floor = {k: math.floor(v / quantum + _EPS) * quantum for k, v in shares.items()}
    left = math.floor((min(capacity, sum(shares.values())) - sum(floor.values())) / quantum + _EPS)
    for k in sorted(shares, key=lambda k: (-(shares[k] - floor[k]), k)):
        if left <= 0:
            break
        cap = math.inf if caps is None else caps.get(k, math.inf)
        if shares[k] - floor[k] > _EPS and floor[k] + quantum <= cap + _EPS:
            floor[k] += quantum
            left -= 1
    return floor
