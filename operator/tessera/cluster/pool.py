"""A pool of free GPUs that hands out tightly packed subsets, anchored at GPUs an owner already holds.

Used by every training policy (Themis' auction solver and the greedy baselines) so they all place gangs
the same way: keep an owner inside the finest region (slot → machine → rack → cluster) that still has
room, and on an empty owner pick the best-fitting region for its target size (Themis §3.1.2).

An owner whose lease ended at this instant may have a `Home`, the GPUs it held: a take for it goes back to
them when that places it no worse for its own slowdown, and other owners take them only when nothing as
good is left. Which GPUs an owner gets then follows what it held; how many stays the policy's call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tessera.cluster.topology import Cluster, Locality

SlotKey = tuple[str, str, int]  # (rack, node, slot)


@dataclass(frozen=True, slots=True)
class _Layout:
    """A cluster's static region structure, built once per cluster (pools are built many times a round)."""

    machines: tuple[object, ...]  # the cluster's machines tuple this was built from (staleness check)
    slot_keys: tuple[SlotKey, ...]
    nodes: tuple[str, ...]
    racks: tuple[str, ...]
    node_slots: dict[str, list[SlotKey]]
    rack_nodes: dict[str, list[str]]
    where: dict[str, SlotKey]  # GPU id → (rack, node, slot)


_LAYOUTS: dict[int, tuple[Cluster, _Layout]] = {}


@dataclass(frozen=True, slots=True)
class Home:
    """The GPUs an owner held until its lease ended this instant, and its slowdown by locality (what a
    placement costs it): moving it elsewhere for no gain would cost it a checkpoint and restart."""

    owner: str
    gpus: frozenset[str]
    slowdown: Callable[[Locality], float]


def _layout(cluster: Cluster) -> _Layout:
    hit = _LAYOUTS.get(id(cluster))
    if hit is not None and hit[0] is cluster and hit[1].machines is cluster.machines:
        return hit[1]
    slot_keys: dict[SlotKey, None] = {}
    nodes: dict[str, None] = {}
    racks: dict[str, None] = {}
    node_slots: dict[str, list[SlotKey]] = {}
    rack_nodes: dict[str, list[str]] = {}
    where: dict[str, SlotKey] = {}
    for m in cluster.machines:
        nodes[m.name] = None
        racks.setdefault(m.rack, None)
        rack_nodes.setdefault(m.rack, []).append(m.name)
        keys: list[SlotKey] = []
        for g in m.gpus:
            k = (g.rack, g.node, g.slot)
            where[g.id] = k
            if k not in slot_keys:
                slot_keys[k] = None
                keys.append(k)
        node_slots[m.name] = keys
    out = _Layout(
        cluster.machines, tuple(slot_keys), tuple(nodes), tuple(racks), node_slots, rack_nodes, where
    )
    if len(_LAYOUTS) > 64:  # simulations build few clusters; keep the cache from growing without bound
        _LAYOUTS.clear()
    _LAYOUTS[id(cluster)] = (cluster, out)
    return out


@dataclass(slots=True)
class Anchor:
    """Where an owner's GPUs are: the racks, machines and slots they span, and how many there are."""

    count: int = 0
    racks: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    slots: set[SlotKey] = field(default_factory=set)

    @staticmethod
    def of(cluster: Cluster, gpu_ids: Iterable[str]) -> Anchor:
        a = Anchor()
        a.add(cluster, gpu_ids)
        return a

    def add(self, cluster: Cluster, gpu_ids: Iterable[str]) -> None:
        where = _layout(cluster).where
        for i in gpu_ids:
            k = where.get(i)
            if k is None:
                cluster.gpu(i)  # raises KeyError naming the unknown GPU
                raise KeyError(f"GPU {i!r} is not in the cluster's layout")
            self.count += 1
            self.racks.add(k[0])
            self.nodes.add(k[1])
            self.slots.add(k)

    def copy(self) -> Anchor:
        return Anchor(self.count, set(self.racks), set(self.nodes), set(self.slots))

    def locality(self) -> Locality:
        if self.count <= 1:
            return Locality.GPU
        if len(self.racks) > 1:
            return Locality.CROSS_RACK
        if len(self.nodes) > 1:
            return Locality.RACK
        if len(self.slots) > 1:
            return Locality.MACHINE
        return Locality.SLOT


class FreePool:
    """Free GPUs indexed by slot, machine and rack, with free counts kept per region."""

    def __init__(self, cluster: Cluster, gpu_ids: Iterable[str] = (), homes: Iterable[Home] = ()) -> None:
        self.cluster = cluster
        lay = self._layout = _layout(cluster)
        self._slot: dict[SlotKey, list[str]] = {k: [] for k in lay.slot_keys}
        self._node_free: dict[str, int] = dict.fromkeys(lay.nodes, 0)
        self._rack_free: dict[str, int] = dict.fromkeys(lay.racks, 0)
        self._node_slots = lay.node_slots  # shared and read-only
        self._rack_nodes = lay.rack_nodes
        self.size = 0
        self._homes = {h.owner: h for h in homes if h.gpus}
        self._claim = {g: o for o, h in self._homes.items() for g in h.gpus}  # GPU → the owner it was home to
        # Free GPUs that are some owner's home, per slot, machine and rack (kept by put and remove).
        self._claimed: tuple[dict[SlotKey, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        self.put(gpu_ids)

    # --- membership -----------------------------------------------------------------------------

    def _slot_of(self, gpu_id: str) -> SlotKey:
        k = self._layout.where.get(gpu_id)
        if k is None:
            self.cluster.gpu(gpu_id)  # raises KeyError naming the unknown GPU
            raise KeyError(f"GPU {gpu_id!r} is not in the cluster's layout")
        return k

    def put(self, gpu_ids: Iterable[str]) -> None:
        for i in gpu_ids:
            k = self._slot_of(i)
            lst = self._slot[k]
            if i in lst:
                raise ValueError(f"GPU {i} is already in the free pool")
            lst.append(i)
            self._node_free[k[1]] += 1
            self._rack_free[k[0]] += 1
            self.size += 1
            if i in self._claim:
                self._count_claim(k, 1)

    def remove(self, gpu_ids: Iterable[str]) -> None:
        for i in gpu_ids:
            k = self._slot_of(i)
            lst = self._slot[k]
            try:
                lst.remove(i)
            except ValueError:
                raise ValueError(f"GPU {i} is not free") from None
            self._node_free[k[1]] -= 1
            self._rack_free[k[0]] -= 1
            self.size -= 1
            if i in self._claim:
                self._count_claim(k, -1)

    def _count_claim(self, k: SlotKey, n: int) -> None:
        slot, node, rack = self._claimed
        slot[k] = slot.get(k, 0) + n
        node[k[1]] = node.get(k[1], 0) + n
        rack[k[0]] = rack.get(k[0], 0) + n

    def ids(self) -> list[str]:
        return [i for lst in self._slot.values() for i in lst]

    # --- placement ------------------------------------------------------------------------------

    def _finest(self, anchor: Anchor) -> tuple[int, str | SlotKey | None]:
        """The finest region level (1 slot, 2 machine, 3 rack, 4 cluster) that encloses the anchor."""
        if len(anchor.slots) == 1:
            return 1, next(iter(anchor.slots))
        if len(anchor.nodes) == 1:
            return 2, next(iter(anchor.nodes))
        if len(anchor.racks) == 1:
            return 3, next(iter(anchor.racks))
        return 4, None

    def _enclosing_free(self, anchor: Anchor, level: int) -> int:
        """Free GPUs in the region of `level` that encloses the anchor (0 if the anchor spans wider)."""
        lvl, _ = self._finest(anchor)
        if level < lvl:
            return 0
        if level == 1:
            return len(self._slot[next(iter(anchor.slots))])
        if level == 2:
            return self._node_free[next(iter(anchor.nodes))]
        if level == 3:
            return self._rack_free[next(iter(anchor.racks))]
        return self.size

    def max_free(self) -> tuple[int, int, int]:
        """Largest free count in any one slot, machine and rack."""
        return (
            max((len(v) for v in self._slot.values()), default=0),
            max(self._node_free.values(), default=0),
            max(self._rack_free.values(), default=0),
        )

    def outlook(self, anchor: Anchor, maxima: tuple[int, int, int] | None = None) -> tuple[int, ...]:
        """Everything `predict` reads of the pool for this anchor (besides its size and GPU count): equal
        outlooks give equal predictions for every d, so callers may remember them by it."""
        if anchor.count == 0:
            return (self.size, *(maxima if maxima is not None else self.max_free()))
        lvl, _ = self._finest(anchor)
        return (self.size, lvl, *(self._enclosing_free(anchor, level) for level in range(lvl, 4)))

    def predict(self, anchor: Anchor, d: int, maxima: tuple[int, int, int] | None = None) -> Locality | None:
        """Locality of anchor ∪ d more GPUs if they were taken now; None if fewer than d are free."""
        if d > self.size:
            return None
        if anchor.count + d <= 1:
            return Locality.GPU
        if anchor.count == 0:
            ms, mm, mr = maxima if maxima is not None else self.max_free()
            if ms >= d:
                return Locality.SLOT
            if mm >= d:
                return Locality.MACHINE
            if mr >= d:
                return Locality.RACK
            return Locality.CROSS_RACK
        lvl, _ = self._finest(anchor)
        for level in range(lvl, 4):
            if self._enclosing_free(anchor, level) >= d:
                return _LEVEL_LOCALITY[level]
        return Locality.CROSS_RACK

    def take(self, anchor: Anchor, d: int, grow_to: int = 0, owner: str | None = None) -> list[str]:
        """Remove and return d GPUs placed as tightly as possible next to the anchor.

        An empty anchor picks the best-fitting region with room for `grow_to` (its eventual size) so a
        gang that grows one GPU at a time does not start on a machine it cannot grow on. The owner's home
        GPUs come first where they place it as well; other owners' homes come last.
        """
        if d <= 0:
            return []
        if d > self.size:
            raise ValueError(f"asked for {d} GPUs but only {self.size} are free")
        mine = self._mine(owner)
        if anchor.count == 0:
            want = max(d, grow_to)
            keys = self._best_fit_region(want, mine)
            best = _spread(want, _level_of(keys)) if keys else Locality.CROSS_RACK
            back = self._home_gpus(owner, mine, anchor, want, best)
            home = None if back is not None else self._home_region(owner, mine, want, keys)
            if back is not None:
                picked = back[:d]
            elif home is not None:
                picked = self._take_from(home, d, prefer=anchor, mine=mine, owner=owner)
            elif keys is not None and len({k[1] for k in keys}) == 1:
                picked = self._take_from(keys, d, prefer=anchor, mine=mine, owner=owner)
            else:
                # It will span machines anyway: use up the smallest leftovers, keep big machines whole.
                picked = self._take_from(
                    keys or self._best_fit_region(d, mine),
                    d,
                    prefer=anchor,
                    smallest_first=True,
                    mine=mine,
                    owner=owner,
                )
        else:
            lvl, _ = self._finest(anchor)
            level = lvl
            while level < 4 and self._enclosing_free(anchor, level) < d:
                level += 1
            back = self._home_gpus(owner, mine, anchor, d, self.predict(anchor, d) or Locality.CROSS_RACK)
            picked = back or self._take_from(
                self._region_slots(anchor, level), d, prefer=anchor, mine=mine, owner=owner
            )
        self.remove(picked)
        return picked

    # --- homes ----------------------------------------------------------------------------------

    def at_home(self, owner: str) -> bool:
        """Whether some of the owner's home GPUs are still free."""
        return bool(self._mine(owner))

    def _mine(self, owner: str | None) -> dict[SlotKey, int]:
        """The owner's free home GPUs per slot (empty without a home)."""
        h = self._homes.get(owner) if owner is not None else None
        if h is None:
            return {}
        out: dict[SlotKey, int] = {}
        for g in h.gpus:
            k = self._layout.where.get(g)
            if k is not None and g in self._slot[k]:
                out[k] = out.get(k, 0) + 1
        return out

    def _home_gpus(
        self, owner: str | None, mine: dict[SlotKey, int], anchor: Anchor, n: int, than: Locality
    ) -> list[str] | None:
        """n of the owner's free home GPUs, nearest the anchor first, if the anchor with them places the
        owner no worse for its slowdown than `than` (what the region rule would give it); else None."""
        if owner is None or sum(mine.values()) < n:
            return None
        in_node: dict[str, int] = {}
        in_rack: dict[str, int] = {}
        for k, c in mine.items():
            in_node[k[1]] = in_node.get(k[1], 0) + c
            in_rack[k[0]] = in_rack.get(k[0], 0) + c
        home = self._homes[owner]
        order = sorted(
            (
                g
                for g in home.gpus
                if self._layout.where.get(g) in mine and g in self._slot[self._layout.where[g]]
            ),
            key=lambda g: (*_near(self._layout.where[g], anchor, mine, in_node, in_rack), g),
        )
        picked = order[:n]
        after = anchor.copy()
        after.add(self.cluster, picked)
        return picked if home.slowdown(after.locality()) <= home.slowdown(than) + 1e-12 else None

    def _home_region(
        self, owner: str | None, mine: dict[SlotKey, int], want: int, best: list[SlotKey] | None
    ) -> list[SlotKey] | None:
        """The region around the owner's home that holds `want` GPUs, if it places the owner no worse for
        its slowdown than the best fit does; None otherwise."""
        if not mine or owner is None or want > self.size:
            return None
        k0 = max(mine, key=lambda k: (mine[k], k))
        level = next(
            lvl
            for lvl, free in enumerate(
                (len(self._slot[k0]), self._node_free[k0[1]], self._rack_free[k0[0]], self.size), 1
            )
            if free >= want
        )
        slow = self._homes[owner].slowdown
        if best is not None and slow(_spread(want, level)) > slow(_spread(want, _level_of(best))) + 1e-12:
            return None
        anchor = Anchor(1, {k0[0]}, {k0[1]}, {k0})
        return self._region_slots(anchor, level)

    def _region_slots(self, anchor: Anchor, level: int) -> list[SlotKey]:
        if level == 1:
            return [next(iter(anchor.slots))]
        if level == 2:
            return list(self._node_slots[next(iter(anchor.nodes))])
        if level == 3:
            rack = next(iter(anchor.racks))
            return [k for n in self._rack_nodes[rack] for k in self._node_slots[n]]
        return list(self._slot)

    def _best_fit_region(self, want: int, mine: dict[SlotKey, int] | None = None) -> list[SlotKey] | None:
        """The smallest slot, else machine, else rack with room for `want`; at each level a region with
        room outside other owners' homes first (their owners may come back to them at no cost)."""
        if self._claim and any(self._claimed[0].values()):
            slot_c, node_c, rack_c = self._claimed
            own_slot = mine or {}
            own_node: dict[str, int] = {}
            own_rack: dict[str, int] = {}
            for k, n in own_slot.items():
                own_node[k[1]] = own_node.get(k[1], 0) + n
                own_rack[k[0]] = own_rack.get(k[0], 0) + n
            return self._fit(
                want,
                lambda k: len(self._slot[k]) - slot_c.get(k, 0) + own_slot.get(k, 0),
                lambda n: self._node_free[n] - node_c.get(n, 0) + own_node.get(n, 0),
                lambda r: self._rack_free[r] - rack_c.get(r, 0) + own_rack.get(r, 0),
            )
        return self._fit(want, None, None, None)

    def _fit(
        self,
        want: int,
        slot_room: Callable[[SlotKey], int] | None,
        node_room: Callable[[str], int] | None,
        rack_room: Callable[[str], int] | None,
    ) -> list[SlotKey] | None:
        """Best fit by free count; with room functions, a region whose room fits is preferred at its level."""
        best: SlotKey | None = None
        best_rank: tuple[bool, int] = (True, 0)
        for k, lst in self._slot.items():
            if len(lst) >= want:
                rank = (slot_room is not None and slot_room(k) < want, len(lst))
                if best is None or rank < best_rank:
                    best, best_rank = k, rank
        if best is not None:
            return [best]
        nodes = [n for n, f in self._node_free.items() if f >= want]
        if nodes:
            node = min(
                nodes, key=lambda n: (node_room is not None and node_room(n) < want, self._node_free[n])
            )
            return list(self._node_slots[node])
        racks = [r for r, f in self._rack_free.items() if f >= want]
        if racks:
            rack = min(
                racks, key=lambda r: (rack_room is not None and rack_room(r) < want, self._rack_free[r])
            )
            return [k for n in self._rack_nodes[rack] for k in self._node_slots[n]]
        return None if want > self.size else list(self._slot)

    def _take_from(
        self,
        keys: list[SlotKey] | None,
        d: int,
        prefer: Anchor,
        smallest_first: bool = False,
        mine: dict[SlotKey, int] | None = None,
        owner: str | None = None,
    ) -> list[str]:
        """d GPUs from these slots: the anchor's own slots/machines/racks first, then the slots holding
        the owner's home, then the fullest. In a slot: the owner's home, then unclaimed GPUs, then others'
        homes."""
        if keys is None:
            keys = list(self._slot)
        mine = mine or {}
        claimed = self._claimed[0]

        def rank(k: SlotKey) -> tuple[int, int, int, int, int, int]:
            return (
                k not in prefer.slots,
                k[1] not in prefer.nodes,
                k[0] not in prefer.racks,
                -mine.get(k, 0),
                -self._rack_free[k[0]] if len(keys) > 1 else 0,
                (self._node_free[k[1]] if smallest_first else -self._node_free[k[1]]) * 1000
                - len(self._slot[k]),
            )

        out: list[str] = []
        for k in sorted(keys, key=rank):
            gpus = self._slot[k]
            if mine.get(k) or claimed.get(k):
                gpus = sorted(gpus, key=lambda g: self._claim_rank(g, owner))
            for i in gpus:
                out.append(i)
                if len(out) == d:
                    return out
        raise ValueError(f"region has fewer than {d} free GPUs")

    def _claim_rank(self, gpu: str, owner: str | None) -> int:
        """0: the owner's home, 1: nobody's, 2: another owner's home."""
        who = self._claim.get(gpu)
        return 1 if who is None else (0 if who == owner else 2)


_LEVEL_LOCALITY = {1: Locality.SLOT, 2: Locality.MACHINE, 3: Locality.RACK, 4: Locality.CROSS_RACK}


def _near(
    k: SlotKey, anchor: Anchor, mine: dict[SlotKey, int], in_node: dict[str, int], in_rack: dict[str, int]
) -> tuple[int, int, int, int, int, int]:
    """Sort key of a home GPU in slot k: inside the anchor's slot, machine, rack first, then where most of
    the home is (rack, machine, slot)."""
    return (
        k not in anchor.slots,
        k[1] not in anchor.nodes,
        k[0] not in anchor.racks,
        -in_rack[k[0]],
        -in_node[k[1]],
        -mine[k],
    )


def _spread(n: int, level: int) -> Locality:
    """Locality of n GPUs taken inside one region of this level (the same reading as `predict`)."""
    return Locality.GPU if n <= 1 else _LEVEL_LOCALITY[level]


def _level_of(keys: list[SlotKey]) -> int:
    if len(keys) == 1:
        return 1
    if len({k[1] for k in keys}) == 1:
        return 2
    return 3 if len({k[0] for k in keys}) == 1 else 4
