"""Where a TrialGroup's trials run on concrete GPUs: packed lanes and multi-GPU gangs.

Pure function of its inputs, called by the operator when it reconciles a TrialGroup and by the simulator.
Fluid itself is placement-agnostic (dissertation §5.1); we add the obvious topology rule: a
multi-GPU trial takes GPUs from one machine when one has room (best fit), else from the fewest machines.
Packed trials fill one GPU at a time, c per GPU, in non-increasing h order (the NFDH shelves of the
Theorem 1 proof, Appendix B), each in a lane with an equal share of the GPU or its declared memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from tessera.cluster import Cluster
from tessera.policy.fluid.config import FluidConfig
from tessera.policy.fluid.water_filling import planning_order, static_widths


@dataclass(frozen=True, slots=True)
class TrialDemand:
    """A trial to place: its remaining single-GPU runtime h_{i,1} (s) and optional declared memory."""

    trial_id: str
    h1: float
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class PackedLane:
    """A packed trial's slice of one GPU (enforced on the node with MPS)."""

    gpu_id: str
    trial_id: str
    memory_mib: int
    compute_percent: int


@dataclass(frozen=True, slots=True)
class TrialGroupPlacement:
    widths: dict[str, Fraction]
    gangs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # trial → its whole GPUs (w ≥ 1)
    lanes: dict[str, tuple[PackedLane, ...]] = field(default_factory=dict)  # GPU → packed lanes on it
    queued: tuple[str, ...] = ()  # trials with no room yet, in the order they should start

    def gpus_of(self, trial_id: str) -> tuple[str, ...]:
        if trial_id in self.gangs:
            return self.gangs[trial_id]
        return tuple(g for g, ls in self.lanes.items() if any(lane.trial_id == trial_id for lane in ls))

    def used_gpus(self) -> set[str]:
        used = {g for gs in self.gangs.values() for g in gs}
        return used | {g for g, ls in self.lanes.items() if ls}


def choose_gang(cluster: Cluster, free: Sequence[str], width: int) -> list[str]:
    """`width` GPUs out of `free`: one machine if any fits (the fullest that fits), else fewest machines."""
    if width > len(free):
        raise ValueError(f"cannot form a {width}-GPU gang from {len(free)} free GPUs")
    per_machine = cluster.by_machine(free)
    fitting = [gs for gs in per_machine.values() if len(gs) >= width]
    if fitting:
        best = min(fitting, key=len)  # min() keeps the first in topological order on ties
        return best[:width]
    out: list[str] = []
    for gs in sorted(per_machine.values(), key=len, reverse=True):
        out.extend(gs[: width - len(out)])
        if len(out) == width:
            break
    return out


def place(
    cluster: Cluster,
    gpu_ids: Sequence[str],
    demands: Sequence[TrialDemand],
    widths: Sequence[Fraction],
    c: int,
    existing_lanes: Mapping[str, Sequence[PackedLane]] | None = None,
) -> TrialGroupPlacement:
    """Place trials with given widths on `gpu_ids`.

    `existing_lanes` are lanes already running on some of these GPUs (packed trials of this group); new
    packed trials may join them up to c per GPU, and those GPUs are not used for gangs.
    """
    existing = {g: list(ls) for g, ls in (existing_lanes or {}).items() if ls}
    _check(cluster, gpu_ids, demands, widths, c, existing)
    ids = [d.trial_id for d in demands]
    free = cluster.sorted(g for g in gpu_ids if g not in existing)
    order = planning_order([d.h1 for d in demands])
    order.sort(key=lambda i: -widths[i])  # stable: by width, then by h (same order when widths come from h)
    gangs: dict[str, tuple[str, ...]] = {}
    queued: list[str] = []
    small: list[int] = []
    for i in order:
        w = widths[i]
        if w < 1:
            small.append(i)
            continue
        if w.denominator != 1:
            raise ValueError(f"trial {ids[i]}: a width >= 1 must be a whole number of GPUs, got {w}")
        if int(w) > len(free):
            queued.append(ids[i])
            continue
        gang = choose_gang(cluster, free, int(w))
        gangs[ids[i]] = tuple(gang)
        taken = set(gang)
        free = [g for g in free if g not in taken]
    lanes = existing
    queued += _pack(cluster, lanes, free, [demands[i] for i in small], c)
    return TrialGroupPlacement(
        widths=dict(zip(ids, widths, strict=True)),
        gangs=gangs,
        lanes={g: tuple(ls) for g, ls in lanes.items()},
        queued=tuple(queued),
    )


def _check(
    cluster: Cluster,
    gpu_ids: Sequence[str],
    demands: Sequence[TrialDemand],
    widths: Sequence[Fraction],
    c: int,
    existing: Mapping[str, Sequence[PackedLane]],
) -> None:
    if len(demands) != len(widths):
        raise ValueError("need one width per trial")
    ids = [d.trial_id for d in demands]
    if len(set(ids)) != len(ids):
        raise ValueError("trial ids in a TrialGroup must be unique")
    for g in gpu_ids:
        cluster.gpu(g)  # raises KeyError naming an unknown GPU
    biggest = max((cluster.gpu(g).memory_mib for g in gpu_ids), default=0)
    for d in demands:
        if d.memory_mib is not None and d.memory_mib > biggest:
            raise ValueError(
                f"trial {d.trial_id} declares {d.memory_mib} MiB, more than any of its GPUs has "
                f"({biggest} MiB); lower its memory or give the group larger GPUs"
            )
    for g, ls in existing.items():
        if g not in gpu_ids:
            raise ValueError(f"existing lanes on GPU {g} which is not among the GPUs to plan on")
        if len(ls) > c:
            raise ValueError(f"GPU {g} already has {len(ls)} lanes, more than c={c}")


def _pack(
    cluster: Cluster, lanes: dict[str, list[PackedLane]], free: list[str], small: list[TrialDemand], c: int
) -> list[str]:
    """Pack the sub-GPU trials into lanes, up to c per GPU (`lanes` and `free` are updated); returns the
    trials that found no room."""
    queued: list[str] = []
    open_gpus = [g for g in cluster.sorted(lanes) if len(lanes[g]) < c]
    for d in small:
        gpu = _packing_gpu(cluster, lanes, open_gpus, free, d, c)
        if gpu is None:
            queued.append(d.trial_id)
            continue
        if gpu in free:
            free.remove(gpu)
            lanes[gpu] = []
            open_gpus.append(gpu)
        share = cluster.gpu(gpu).memory_mib // c
        lanes[gpu].append(PackedLane(gpu, d.trial_id, d.memory_mib or share, 100 // c))
        if len(lanes[gpu]) >= c:
            open_gpus.remove(gpu)
    return queued


def _packing_gpu(
    cluster: Cluster,
    lanes: Mapping[str, Sequence[PackedLane]],
    open_gpus: Sequence[str],
    free: Sequence[str],
    d: TrialDemand,
    c: int,
) -> str | None:
    """Next-fit on the open GPUs (memory permitting), then a fresh free GPU."""
    for g in open_gpus:
        cap = cluster.gpu(g).memory_mib
        need = d.memory_mib or cap // c
        if sum(lane.memory_mib for lane in lanes[g]) + need <= cap:
            return g
    for g in free:
        cap = cluster.gpu(g).memory_mib
        if (d.memory_mib or cap // c) <= cap:
            return g
    return None


def plan_trial_group(
    cluster: Cluster, gpu_ids: Sequence[str], demands: Sequence[TrialDemand], config: FluidConfig
) -> TrialGroupPlacement:
    """StaticFluid on the given idle GPUs (n = len(gpu_ids)), then placement. The operator's entry point."""
    if not gpu_ids:
        raise ValueError("a TrialGroup needs at least one GPU to plan on")
    widths = static_widths([d.h1 for d in demands], len(gpu_ids), config)
    return place(cluster, gpu_ids, demands, widths, config.c)
