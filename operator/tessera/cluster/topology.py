"""Cluster topology: GPUs in slots on machines in racks, and the locality of a GPU set.

Plain frozen data. Policies take a `Cluster` and sets of GPU ids; nothing here talks to Kubernetes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class Locality(IntEnum):
    """How spread out a set of GPUs is. Ordered: a larger value is a worse placement."""

    GPU = 0  # a single GPU (or nothing)
    SLOT = 1  # several GPUs in one slot (e.g. an NVLink / PCIe-switch pair)
    MACHINE = 2  # one machine, several slots
    RACK = 3  # several machines in one rack
    CROSS_RACK = 4  # several racks


@dataclass(frozen=True, slots=True)
class GPU:
    id: str  # stable identifier: the GPU UUID on a real node, "<node>/<index>" in simulations
    node: str
    index: int
    slot: int = 0
    rack: str = "rack-0"
    model: str = "generic"
    memory_mib: int = 16384
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    rack: str
    gpus: tuple[GPU, ...]


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """Placement slowdown S by locality level (iteration time multiplier, ≥ 1).

    Defaults follow Themis footnote 3: 1.0 within a machine, 1.1 across machines, 1.3 across racks.
    """

    slot: float = 1.0
    machine: float = 1.0
    cross_machine: float = 1.1
    cross_rack: float = 1.3

    def __post_init__(self) -> None:
        for name in ("slot", "machine", "cross_machine", "cross_rack"):
            if getattr(self, name) < 1.0:
                raise ValueError(f"placement slowdown {name} must be >= 1.0, got {getattr(self, name)}")

    def slowdown(self, locality: Locality) -> float:
        if locality <= Locality.SLOT:
            return self.slot if locality == Locality.SLOT else 1.0
        if locality == Locality.MACHINE:
            return self.machine
        if locality == Locality.RACK:
            return self.cross_machine
        return self.cross_rack


NETWORK_INTENSIVE = Sensitivity(slot=1.0, machine=1.0, cross_machine=1.29, cross_rack=1.29 * 1.3 / 1.1)
COMPUTE_INTENSIVE = Sensitivity(slot=1.0, machine=1.0, cross_machine=1.0, cross_rack=1.05)


@dataclass(slots=True)
class Cluster:
    """A set of machines. GPU ids are unique across the cluster."""

    machines: tuple[Machine, ...]
    _by_id: dict[str, GPU] = field(init=False, repr=False)
    _order: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_id = {}
        self._order = {}
        for m in self.machines:
            for g in m.gpus:
                if g.id in self._by_id:
                    raise ValueError(f"duplicate GPU id {g.id!r}")
                self._order[g.id] = len(self._by_id)
                self._by_id[g.id] = g

    @property
    def gpus(self) -> list[GPU]:
        return list(self._by_id.values())

    @property
    def gpu_ids(self) -> list[str]:
        return list(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, gpu_id: object) -> bool:
        return gpu_id in self._by_id

    def iter_gpu_ids(self) -> Iterator[str]:
        """The GPU ids in cluster order, without copying them (`gpu_ids` is a fresh list)."""
        return iter(self._by_id)

    def gpu(self, gpu_id: str) -> GPU:
        try:
            return self._by_id[gpu_id]
        except KeyError:
            raise KeyError(f"unknown GPU {gpu_id!r}") from None

    def order(self, gpu_id: str) -> int:
        """Position in a stable topological order (rack, machine, slot, index)."""
        return self._order[gpu_id]

    def sorted(self, gpu_ids: Iterable[str]) -> list[str]:
        return sorted(gpu_ids, key=self._order.__getitem__)

    def locality(self, gpu_ids: Iterable[str]) -> Locality:
        gs = [self._by_id[i] for i in gpu_ids]
        if len(gs) <= 1:
            return Locality.GPU
        if len({g.rack for g in gs}) > 1:
            return Locality.CROSS_RACK
        if len({g.node for g in gs}) > 1:
            return Locality.RACK
        if len({g.slot for g in gs}) > 1:
            return Locality.MACHINE
        return Locality.SLOT

    def slowdown(self, gpu_ids: Iterable[str], sensitivity: Sensitivity) -> float:
        """Placement slowdown S(G) of running one gang on these GPUs."""
        return sensitivity.slowdown(self.locality(gpu_ids))

    def by_machine(self, gpu_ids: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for i in self.sorted(gpu_ids):
            out.setdefault(self._by_id[i].node, []).append(i)
        return out

    def subset(self, gpu_ids: Iterable[str]) -> Cluster:
        """The same machines with only these GPUs (a team queue's share, as its policy sees it)."""
        keep = set(gpu_ids)
        machines = []
        for m in self.machines:
            gpus = tuple(g for g in m.gpus if g.id in keep)
            if gpus:
                machines.append(Machine(name=m.name, rack=m.rack, gpus=gpus))
        return Cluster(tuple(machines))

    # --- builders -------------------------------------------------------------------------------

    @staticmethod
    def build(
        machine_shapes: Sequence[tuple[int, int]],
        machines_per_rack: int = 8,
        memory_mib: int = 16384,
        model: str = "generic",
        prefix: str = "m",
    ) -> Cluster:
        """Machines from (slots, gpus_per_slot) shapes, filled into racks in order."""
        if machines_per_rack < 1:
            raise ValueError("machines_per_rack must be >= 1")
        machines = []
        for mi, (slots, per_slot) in enumerate(machine_shapes):
            if slots < 1 or per_slot < 1:
                raise ValueError(f"machine {mi}: slots and gpus per slot must be >= 1")
            name = f"{prefix}{mi:03d}"
            rack = f"rack-{mi // machines_per_rack}"
            gpus = tuple(
                GPU(
                    id=f"{name}/{s * per_slot + k}",
                    node=name,
                    index=s * per_slot + k,
                    slot=s,
                    rack=rack,
                    model=model,
                    memory_mib=memory_mib,
                )
                for s in range(slots)
                for k in range(per_slot)
            )
            machines.append(Machine(name=name, rack=rack, gpus=gpus))
        return Cluster(tuple(machines))

    @staticmethod
    def homogeneous(
        machines: int, gpus_per_machine: int, machines_per_rack: int = 8, memory_mib: int = 16384
    ) -> Cluster:
        return Cluster.build([(1, gpus_per_machine)] * machines, machines_per_rack, memory_mib)

    @staticmethod
    def themis_paper(variant: str = "256") -> Cluster:
        """The Themis simulator's heterogeneous cluster (Themis §6.1).

        "168": the machine list as written (16×8-GPU [4 slots × 2], 6×4-GPU [4 × 1], 16×1-GPU).
        "256": the same mix scaled to 256 GPUs (the paper's stated size); the spec flags the mismatch.
        """
        if variant == "168":
            shapes = [(4, 2)] * 16 + [(4, 1)] * 6 + [(1, 1)] * 16
        elif variant == "256":
            shapes = [(4, 2)] * 24 + [(4, 1)] * 10 + [(1, 1)] * 24
        else:
            raise ValueError(f"unknown Themis cluster variant {variant!r}; use '168' or '256'")
        return Cluster.build(shapes, machines_per_rack=8)
