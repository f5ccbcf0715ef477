"""A pool of free GPUs that hands out tightly packed subsets, anchored at GPUs an owner already holds.

Used by every training policy (Themis' auction solver and the greedy baselines) so they all place gangs
the same way: keep an owner inside the finest region (slot → machine → rack → cluster) that still has
room, and on an empty owner pick the best-fitting region for its target size (Themis §3.1.2).
"""

from __future__ import annotations

from collections.abc import Iterable
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

    def __init__(self, cluster: Cluster, gpu_ids: Iterable[str] = ()) -> None:
        self.cluster = cluster
        lay = self._layout = _layout(cluster)
        self._slot: dict[SlotKey, list[str]] = {k: [] for k in lay.slot_keys}
        self._node_free: dict[str, int] = dict.fromkeys(lay.nodes, 0)
        self._rack_free: dict[str, int] = dict.fromkeys(lay.racks, 0)
        self._node_slots = lay.node_slots  # shared and read-only
        self._rack_nodes = lay.rack_nodes
        self.size = 0
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

    def take(self, anchor: Anchor, d: int, grow_to: int = 0) -> list[str]:
        """Remove and return d GPUs placed as tightly as possible next to the anchor.

        An empty anchor picks the best-fitting region with room for `grow_to` (its eventual size) so a
        gang that grows one GPU at a time does not start on a machine it cannot grow on.
        """
        if d <= 0:
            return []
        if d > self.size:
            raise ValueError(f"asked for {d} GPUs but only {self.size} are free")
        if anchor.count == 0:
            want = max(d, grow_to)
            keys = self._best_fit_region(want)
            if keys is not None and len({k[1] for k in keys}) == 1:
                picked = self._take_from(keys, d, prefer=anchor)
            else:
                # It will span machines anyway: use up the smallest leftovers, keep big machines whole.
                picked = self._take_from(
                    keys or self._best_fit_region(d), d, prefer=anchor, smallest_first=True
                )
        else:
            lvl, _ = self._finest(anchor)
            level = lvl
            while level < 4 and self._enclosing_free(anchor, level) < d:
                level += 1
            picked = self._take_from(self._region_slots(anchor, level), d, prefer=anchor)
        self.remove(picked)
        return picked

    def _region_slots(self, anchor: Anchor, level: int) -> list[SlotKey]:
        if level == 1:
            return [next(iter(anchor.slots))]
        if level == 2:
            return list(self._node_slots[next(iter(anchor.nodes))])
        if level == 3:
            rack = next(iter(anchor.racks))
            return [k for n in self._rack_nodes[rack] for k in self._node_slots[n]]
        return list(self._slot)

    def _best_fit_region(self, want: int) -> list[SlotKey] | None:
        best: SlotKey | None = None
        for k, lst in self._slot.items():
            if len(lst) >= want and (best is None or len(lst) < len(self._slot[best])):
                best = k
        if best is not None:
            return [best]
        node = min(
            (n for n, f in self._node_free.items() if f >= want),
            key=self._node_free.__getitem__,
            default=None,
        )
        if node is not None:
            return list(self._node_slots[node])
        rack = min(
            (r for r, f in self._rack_free.items() if f >= want),
            key=self._rack_free.__getitem__,
            default=None,
        )
        if rack is not None:
            return [k for n in self._rack_nodes[rack] for k in self._node_slots[n]]
        return None if want > self.size else list(self._slot)

    def _take_from(
        self, keys: list[SlotKey] | None, d: int, prefer: Anchor, smallest_first: bool = False
    ) -> list[str]:
        """d GPUs from these slots: the anchor's own slots/machines/racks first, then the fullest."""
        if keys is None:
            keys = list(self._slot)

        def rank(k: SlotKey) -> tuple[int, int, int, int, int]:
            return (
                k not in prefer.slots,
                k[1] not in prefer.nodes,
                k[0] not in prefer.racks,
                -self._rack_free[k[0]] if len(keys) > 1 else 0,
                (self._node_free[k[1]] if smallest_first else -self._node_free[k[1]]) * 1000
                - len(self._slot[k]),
            )

        out: list[str] = []
        for k in sorted(keys, key=rank):
            for i in self._slot[k]:
                out.append(i)
                if len(out) == d:
                    return out
        raise ValueError(f"region has fewer than {d} free GPUs")


_LEVEL_LOCALITY = {1: Locality.SLOT, 2: Locality.MACHINE, 3: Locality.RACK, 4: Locality.CROSS_RACK}
