"""Choosing GPUs on a node for a pod: fit, Orion-style interference rules, fragmentation-aware scores.

Fit: each chosen GPU is healthy and has the memory and compute share the pod asks for.

Interference (Orion, spec B.1/C.3): a workload has a profile — the fraction of its GPU time that is
compute-bound (1.0 compute-bound, 0.0 memory-bound, or a measured value; unknown counts as 0.5) — and a
class, latency-critical (HP) or best-effort (BE).
- At most `max_latency_critical_per_gpu` (default 1, Orion's single HP client) LC pods per GPU.
- Best-effort work may overcommit compute on GPUs without LC work (`best_effort_overcommit`), but never on a
  GPU with an LC pod: there the shares must add up to ≤ 100 so the LC lane keeps its share.
- Complementary profiles are preferred: 1 − |c_a − (1 − c_b)| (spec C.3(e)); Conv2d–BN2d collocation gave
  1.41× vs 0.98× for Conv2d–Conv2d (Orion Table 2, §3.2).

Scores (each in [0, 1], higher is better), combined by weights:
- binpack: best-fit on the GPU (how full the chosen GPUs are after placement: the tightest remaining
  memory + compute that fits wins) averaged with how full the node is after placement (prefer nodes in use,
  the node policy HAMi and gpushare default to, as in their scheduler configs). spread is 1 − binpack.
- interference: the mean complementarity with the pods already on the chosen GPUs (0.5, neutral, when
  alone, so a complementary partner is preferred to an empty GPU and an empty GPU to a same-kind one).
- fragmentation: 1 minus the mean of two penalties: a sliver of memory or compute left below
  `sliver_fraction` of the GPU (off by default, see PlacementConfig), and breaking a whole GPU with a
  fractional pod, which multi-GPU pods need whole (a common complaint against HAMi and gpushare);
  at node level, a pod taking whole GPUs loses by how many whole GPUs the node keeps, so whole GPUs are taken
  where fewest remain and nodes with many stay free for multi-GPU pods.

Multi-GPU pods take GPUs by slot locality (tessera.cluster.Locality): one slot first (GPUs
`gpus_per_slot` apart by index, e.g. an NVLink pair), otherwise as few slots as possible.

Hot path: a NodeSummary (per-GPU free memory and compute room, sorted tightest first) lets the extender
reject a node with a few comparisons and score at most `max_candidates` GPUs per single-GPU request; a FitIndex
holds the same free memory and room for every node as numpy arrays, so one filter is a few array operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from tessera.cluster.topology import Locality
from tessera.policy.orion.profiles import Profile

WorkloadClass = Literal["latency-critical", "best-effort"]
Strategy = Literal["binpack", "spread", "interference", "fragmentation"]
STRATEGIES: tuple[Strategy, ...] = ("binpack", "spread", "interference", "fragmentation")


class PlacementError(ValueError):
    """Bad placement input (negative request, unknown strategy)."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """A pod already on a GPU, as the scorer needs it."""

    memory_mib: int
    compute_percent: int
    compute_fraction: float = 0.5
    workload_class: WorkloadClass = "best-effort"


@dataclass(slots=True)
class GpuState:
    """One GPU and its tenants; the sums are kept up to date by `add` and `remove` (tenants is a tuple)."""

    index: int
    uuid: str
    memory_mib: int
    healthy: bool = True
    tenants: tuple[Tenant, ...] = ()
    used_memory: int = field(init=False, default=0)
    used_compute: int = field(init=False, default=0)
    latency_critical: int = field(init=False, default=0)
    profile_sum: float = field(init=False, default=0.0)  # Σ tenants' compute-bound fractions
    profile_min: float = field(init=False, default=1.0)
    profile_max: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.memory_mib <= 0:
            raise PlacementError(f"GPU {self.index} must have positive memory, got {self.memory_mib} MiB")
        tenants, self.tenants = tuple(self.tenants), ()
        for t in tenants:
            self.add(t)

    def add(self, tenant: Tenant) -> None:
        self.tenants = (*self.tenants, tenant)
        self.used_memory += tenant.memory_mib
        self.used_compute += tenant.compute_percent
        self.latency_critical += tenant.workload_class == "latency-critical"
        self.profile_sum += tenant.compute_fraction
        self.profile_min = min(self.profile_min, tenant.compute_fraction)
        self.profile_max = max(self.profile_max, tenant.compute_fraction)

    def remove(self, tenant: Tenant) -> bool:
        """Drop this tenant object (by identity); False when it is not here."""
        kept = tuple(t for t in self.tenants if t is not tenant)
        if len(kept) == len(self.tenants):
            return False
        self.tenants = ()
        self.used_memory = self.used_compute = self.latency_critical = 0
        self.profile_sum, self.profile_min, self.profile_max = 0.0, 1.0, 0.0
        for t in kept:
            self.add(t)
        return True


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a pod asks for: `gpus` GPUs with `memory_mib` and `compute_percent` on each."""

    gpus: int
    memory_mib: int
    compute_percent: int
    compute_fraction: float = 0.5
    workload_class: WorkloadClass = "best-effort"

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise PlacementError(f"a GPU pod must ask for at least 1 GPU, got {self.gpus}")
        if self.memory_mib <= 0:
            raise PlacementError(f"GPU memory must be positive, got {self.memory_mib} MiB")
        if not 1 <= self.compute_percent <= 100:
            raise PlacementError(f"compute share must be in 1..100 percent, got {self.compute_percent}")
        if not 0.0 <= self.compute_fraction <= 1.0:
            raise PlacementError(f"compute-bound fraction must be in [0, 1], got {self.compute_fraction}")

    def as_tenant(self) -> Tenant:
        return Tenant(self.memory_mib, self.compute_percent, self.compute_fraction, self.workload_class)


@dataclass(frozen=True)
class PlacementConfig:
    weights: tuple[tuple[Strategy, float], ...] = (
        ("binpack", 1.0),
        ("fragmentation", 0.25),
    )  # interference is opt-in (--score interference=W): at every weight tried it cost packing
    max_latency_critical_per_gpu: int = 1
    best_effort_overcommit: float = 1.0  # ≥ 1: how far BE-only GPUs' compute shares may add up past 100%
    # Slivers below this GPU fraction are penalised; 0 (off) by default: at 0.1 (the smallest common request)
    # the penalty steers pods away from the tightest fits and cost 0.5-1% packing (measured with the synthetic
    # stream bench_packing.py ran before it became the trace experiment).
    sliver_fraction: float = 0.0
    gpus_per_slot: int = 2  # GPUs sharing a slot (NVLink pair / PCIe switch), consecutive by index
    max_candidates: int = 3  # tightest-fitting GPUs scored per single-GPU request
    # Plain GPU pods scored by FGD's rule over the extended measure (policy.lanes.packing) instead of the
    # weights above; the extender builds its PackingConfig from this (`tessera extender --packing`).
    packing: bool = False

    def __post_init__(self) -> None:
        for name, w in self.weights:
            if name not in STRATEGIES:
                raise PlacementError(
                    f"unknown scoring strategy {name!r}; expected one of {', '.join(STRATEGIES)}"
                )
            if w < 0:
                raise PlacementError(f"weight of {name} must be >= 0")
        if self.best_effort_overcommit < 1.0:
            raise PlacementError("best_effort_overcommit must be >= 1.0")
        if not 0.0 <= self.sliver_fraction < 1.0:
            raise PlacementError("sliver_fraction must be in [0, 1)")
        if self.gpus_per_slot < 1 or self.max_candidates < 1:
            raise PlacementError("gpus_per_slot and max_candidates must be >= 1")

    def weight(self, name: Strategy) -> float:
        """The strategy's share of the total weight (0 when absent)."""
        return self.normalised[STRATEGIES.index(name)]

    @cached_property
    def normalised(self) -> tuple[float, float, float, float]:
        """Weights of binpack, spread, interference, fragmentation, summing to 1 (all 0 when none)."""
        total = sum(w for _, w in self.weights)
        w = [sum(v for n, v in self.weights if n == name) / total if total else 0.0 for name in STRATEGIES]
        return (w[0], w[1], w[2], w[3])


# Orion's kernel profiles (§4.1) as the compute-bound fraction the scores use: the extender and the node
# share one vocabulary. With these, complementarity >= 0.5 exactly when Listing 1's
# `have_different_profiles` lets the pair run together (unknown is neutral, 0.5, on either side).
PROFILE_FRACTION: dict[Profile, float] = {Profile.COMPUTE: 1.0, Profile.MEMORY: 0.0, Profile.UNKNOWN: 0.5}


def complementarity(a: float, b: float) -> float:
    """1 − |c_a − (1 − c_b)|: 1 for a compute-bound and a memory-bound pair, 0 for two of the same kind."""
    return 1.0 - abs(a - (1.0 - b))


def _room(gpu: GpuState, cfg: PlacementConfig, latency_critical: bool) -> float:
    """Compute percent a new pod of this class may still take on `gpu` (negative: none)."""
    if latency_critical:
        if gpu.latency_critical + 1 > cfg.max_latency_critical_per_gpu:
            return -1.0
        return 100.0 - gpu.used_compute
    limit = 100.0 if gpu.latency_critical else 100.0 * cfg.best_effort_overcommit
    return limit - gpu.used_compute


def why_not(gpu: GpuState, req: GpuRequest, cfg: PlacementConfig) -> str | None:
    """None when the request fits on `gpu`; otherwise the reason it does not."""
    if not gpu.healthy:
        return f"GPU {gpu.index} is unhealthy"
    free_mem = gpu.memory_mib - gpu.used_memory
    if req.memory_mib > free_mem:
        return f"GPU {gpu.index} has {free_mem} MiB free, pod needs {req.memory_mib}"
    lc = req.workload_class == "latency-critical"
    if lc and gpu.latency_critical + 1 > cfg.max_latency_critical_per_gpu:
        return f"GPU {gpu.index} already has a latency-critical pod"
    if req.compute_percent > _room(gpu, cfg, lc) + 1e-9:
        what = (
            "would take the latency-critical lane below its share"
            if lc or gpu.latency_critical
            else "has too little compute"
        )
        return f"GPU {gpu.index} {what} ({gpu.used_compute}% used, pod needs {req.compute_percent}%)"
    return None


def _fill(gpu: GpuState) -> float:
    return (gpu.used_memory / gpu.memory_mib + min(1.0, gpu.used_compute / 100.0)) / 2.0


def gpu_scores(gpu: GpuState, req: GpuRequest, cfg: PlacementConfig) -> dict[Strategy, float]:
    """The GPU-level part of each score for placing `req` on `gpu` (it must fit)."""
    mem_after = (gpu.used_memory + req.memory_mib) / gpu.memory_mib
    comp_after = min(1.0, (gpu.used_compute + req.compute_percent) / 100.0)
    fill = (mem_after + comp_after) / 2.0
    n = len(gpu.tenants)
    if n:
        inter = sum(complementarity(req.compute_fraction, t.compute_fraction) for t in gpu.tenants) / n
    else:
        inter = 0.5  # neutral: a complementary partner beats an empty GPU, a same-kind one does not
    free_mem, free_comp = 1.0 - mem_after, 1.0 - comp_after
    sliver = ((1e-9 < free_mem < cfg.sliver_fraction) + (1e-9 < free_comp < cfg.sliver_fraction)) / 2.0
    fractional = req.memory_mib < gpu.memory_mib or req.compute_percent < 100
    broken = 1.0 if fractional and n == 0 else 0.0
    return {
        "binpack": fill,
        "spread": 1.0 - fill,
        "interference": inter,
        "fragmentation": 1.0 - (sliver + broken) / 2.0,
    }


def mean_complementarity(c: float, gpu: GpuState) -> float:
    """Mean of complementarity(c, t) over the GPU's tenants; O(1) when all c + t − 1 share a sign."""
    n = len(gpu.tenants)
    if c + gpu.profile_min >= 1.0:
        return 2.0 - c - gpu.profile_sum / n  # mean of 1 − (c + t − 1)
    if c + gpu.profile_max <= 1.0:
        return c + gpu.profile_sum / n  # mean of 1 − (1 − c − t)
    return sum(complementarity(c, t.compute_fraction) for t in gpu.tenants) / n


def gpu_score(gpu: GpuState, req: GpuRequest, cfg: PlacementConfig) -> float:
    """combined(gpu_scores(...)) without building the dict: the extender's hot path (same arithmetic)."""
    w_pack, w_spread, w_inter, w_frag = cfg.normalised
    mem_after = (gpu.used_memory + req.memory_mib) / gpu.memory_mib
    comp_after = (gpu.used_compute + req.compute_percent) / 100.0
    if comp_after > 1.0:
        comp_after = 1.0
    fill = (mem_after + comp_after) / 2.0
    score = w_pack * fill + w_spread * (1.0 - fill)
    tenants = gpu.tenants
    if w_inter:
        score += w_inter * (mean_complementarity(req.compute_fraction, gpu) if tenants else 0.5)
    if w_frag:
        free_mem, free_comp = 1.0 - mem_after, 1.0 - comp_after
        cut = cfg.sliver_fraction
        penalty = ((1e-9 < free_mem < cut) + (1e-9 < free_comp < cut)) / 2.0
        if not tenants and (req.memory_mib < gpu.memory_mib or req.compute_percent < 100):
            penalty += 1.0  # a fractional pod breaks a whole GPU
        score += w_frag * (1.0 - penalty / 2.0)
    return score


def combined(scores: dict[Strategy, float], cfg: PlacementConfig) -> float:
    total = sum(w for _, w in cfg.weights)
    if total == 0:
        return 0.0
    return sum(scores[name] * w for name, w in cfg.weights) / total


class Choice(NamedTuple):
    """Where a pod would go on a node (a NamedTuple: prioritize builds one per node, so it must be cheap)."""

    gpu_indices: tuple[int, ...]
    score: float  # in [0, 1]
    locality: Locality = Locality.GPU


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """What filter needs of a node, recomputed only when the node or its pods change.

    `by_free_memory`: healthy GPUs sorted by free memory ascending (best-fit order), with their compute room
    for a best-effort and a latency-critical pod.
    """

    by_free_memory: tuple[tuple[int, float, float, GpuState], ...]
    healthy: int
    empty: int  # healthy GPUs with no tenant: what multi-GPU pods need
    fill_sum: float  # Σ _fill over healthy GPUs
    max_free_memory: int
    max_room: float

    @staticmethod
    def of(gpus: Sequence[GpuState], cfg: PlacementConfig) -> NodeSummary:
        rows = sorted(
            (
                (g.memory_mib - g.used_memory, _room(g, cfg, False), _room(g, cfg, True), g)
                for g in gpus
                if g.healthy
            ),
            key=lambda r: (r[0], r[3].index),
        )
        return NodeSummary(
            tuple(rows),
            len(rows),
            sum(1 for r in rows if not r[3].tenants),
            sum(_fill(r[3]) for r in rows),
            max((r[0] for r in rows), default=0),
            max((max(r[1], r[2]) for r in rows), default=-1.0),
        )

    def fitting(self, req: GpuRequest) -> list[GpuState]:
        """Healthy GPUs where `req` fits, tightest memory first."""
        m, c = req.memory_mib, req.compute_percent - 1e-9
        if m > self.max_free_memory or c > self.max_room:
            return []
        if req.workload_class == "latency-critical":
            return [g for free, _, room, g in self.by_free_memory if free >= m and room >= c]
        return [g for free, room, _, g in self.by_free_memory if free >= m and room >= c]

    def tightest(self, req: GpuRequest, n: int) -> list[GpuState]:
        """Up to `n` healthy GPUs where `req` fits, tightest memory first (stops at the n-th)."""
        m, c = req.memory_mib, req.compute_percent - 1e-9
        if m > self.max_free_memory or c > self.max_room:
            return []
        lc = req.workload_class == "latency-critical"
        out: list[GpuState] = []
        for free, room_be, room_lc, g in self.by_free_memory:
            if free >= m and (room_lc if lc else room_be) >= c:
                out.append(g)
                if len(out) == n:
                    break
        return out

    def fits(self, req: GpuRequest) -> bool:
        """Whether `req.gpus` GPUs fit: two comparisons reject most full nodes, else one pass over GPUs."""
        if req.gpus > self.healthy:
            return False
        m, c = req.memory_mib, req.compute_percent - 1e-9
        if m > self.max_free_memory or c > self.max_room:
            return False
        lc = req.workload_class == "latency-critical"
        n = 0
        for free, room_be, room_lc, _ in self.by_free_memory:
            if free >= m and (room_lc if lc else room_be) >= c:
                n += 1
                if n == req.gpus:
                    return True
        return False


class FitIndex:
    """Free memory and compute room per GPU of many nodes, as arrays: `fits` tests every node at once.

    Row r is one node, column j its j-th healthy GPU; padding (and a node without an inventory) has free
    memory -1, where no request fits (requests ask for > 0 MiB). Row 0 stays empty: names of unknown nodes map
    there. The test is NodeSummary.fits, element-wise (same float comparisons, so the same answers); rows are
    rewritten by `set_row` when a node or its pods change.
    """

    def __init__(self, cfg: PlacementConfig, width: int = 8, capacity: int = 64) -> None:
        self.cfg = cfg
        self.rows = 1  # row 0: no node
        self._free: npt.NDArray[np.int64] = np.full((capacity, width), -1, dtype=np.int64)
        self._room_be: npt.NDArray[np.float64] = np.full((capacity, width), -1.0)
        self._room_lc: npt.NDArray[np.float64] = np.full((capacity, width), -1.0)

    def add_row(self) -> int:
        """A new empty row (doubling the arrays when full)."""
        if self.rows == len(self._free):
            self._resize(len(self._free), 0)
        self.rows += 1
        return self.rows - 1

    def set_row(self, row: int, gpus: Sequence[GpuState] | None) -> None:
        """Row `row` from the node's GPUs now (None: the node has no usable inventory)."""
        healthy = [g for g in gpus or () if g.healthy]
        if len(healthy) > self._free.shape[1]:
            self._resize(0, len(healthy) - self._free.shape[1])
        self._free[row] = -1
        self._room_be[row] = -1.0
        self._room_lc[row] = -1.0
        for j, g in enumerate(healthy):
            self._free[row, j] = g.memory_mib - g.used_memory
            self._room_be[row, j] = _room(g, self.cfg, False)
            self._room_lc[row, j] = _room(g, self.cfg, True)

    def _resize(self, more_rows: int, more_columns: int) -> None:
        pad = ((0, more_rows), (0, more_columns))
        self._free = np.pad(self._free, pad, constant_values=-1)
        self._room_be = np.pad(self._room_be, pad, constant_values=-1.0)
        self._room_lc = np.pad(self._room_lc, pad, constant_values=-1.0)

    def fits(self, req: GpuRequest, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
        """For each row in `rows`, whether `req.gpus` of its GPUs have the memory and room `req` needs."""
        room = self._room_lc if req.workload_class == "latency-critical" else self._room_be
        ok = (self._free[rows] >= req.memory_mib) & (room[rows] >= req.compute_percent - 1e-9)
        counts: npt.NDArray[np.bool_] = np.count_nonzero(ok, axis=1) >= req.gpus
        return counts


def _slot_choice(
    fitting: Sequence[GpuState], k: int, per_slot: int, key: dict[int, float]
) -> tuple[list[GpuState], Locality]:
    """k GPUs from `fitting` by slot locality: the tightest single slot that holds k, else fewest slots."""
    slots: dict[int, list[GpuState]] = {}
    for g in fitting:
        slots.setdefault(g.index // per_slot, []).append(g)
    for members in slots.values():
        members.sort(key=lambda g: (-key[g.index], g.index))
    whole = [s for s, members in slots.items() if len(members) >= k]
    if whole:
        # best-fit on slots: the one with the fewest spare fitting GPUs, then the best-scored GPUs
        best = min(whole, key=lambda s: (len(slots[s]), -sum(key[g.index] for g in slots[s][:k]), s))
        return slots[best][:k], (Locality.SLOT if k > 1 else Locality.GPU)
    chosen: list[GpuState] = []
    for s in sorted(slots, key=lambda s: (-len(slots[s]), s)):
        chosen.extend(slots[s][: k - len(chosen)])
        if len(chosen) == k:
            break
    return chosen, Locality.MACHINE


def choose_gpus(
    gpus: Sequence[GpuState],
    req: GpuRequest,
    cfg: PlacementConfig,
    *,
    only: Sequence[int] | None = None,
    summary: NodeSummary | None = None,
) -> Choice | str:
    """The best `req.gpus` GPUs of a node or the reason none fit. `only`: GPUs fixed by a placement.

    `summary` (NodeSummary.of(gpus, cfg), kept by the caller) bounds the work for single-GPU pods to the
    `max_candidates` tightest fits.
    """
    if only is not None:
        by_index = {g.index: g for g in gpus}
        missing = [i for i in only if i not in by_index]
        if missing:
            return f"placement names GPU index {missing[0]}, which the node does not have"
        if len(only) != req.gpus:
            return f"placement names {len(only)} GPUs but the pod asks for {req.gpus}"
        fitting = [by_index[i] for i in only]
        reasons = [r for r in (why_not(g, req, cfg) for g in fitting) if r is not None]
        if reasons:
            return f"{len(fitting) - len(reasons)} of {req.gpus} GPUs fit: {'; '.join(reasons[:3])}"
    else:
        if summary is None:
            summary = NodeSummary.of(gpus, cfg)
        if req.gpus == 1:
            return _choose_one(gpus, req, cfg, summary)
        fitting = summary.fitting(req)
        if len(fitting) < req.gpus:
            return _reason(gpus, req, cfg, len(fitting))
    if summary is None:
        summary = NodeSummary.of(gpus, cfg)
    scores = {g.index: gpu_score(g, req, cfg) for g in fitting}
    if req.gpus == 1 or only is not None:
        best = sorted(fitting, key=lambda g: (-scores[g.index], g.index))[: req.gpus]
        locality = _locality(best, cfg.gpus_per_slot)
    else:
        best, locality = _slot_choice(fitting, req.gpus, cfg.gpus_per_slot, scores)
    score = sum(scores[g.index] for g in best) / req.gpus
    score = _with_node_fill(score, best, req, summary, cfg)
    return Choice(tuple(sorted(g.index for g in best)), score, locality)


def _choose_one(
    gpus: Sequence[GpuState], req: GpuRequest, cfg: PlacementConfig, summary: NodeSummary
) -> Choice | str:
    """Single-GPU pods: score only the `max_candidates` tightest fits (best-fit order), lowest index on ties."""
    best: GpuState | None = None
    best_score = -1.0
    for g in summary.tightest(req, cfg.max_candidates):
        s = gpu_score(g, req, cfg)
        if s > best_score + 1e-12 or (best is not None and s > best_score - 1e-12 and g.index < best.index):
            best, best_score = g, s
    if best is None:
        return _reason(gpus, req, cfg, 0)
    return Choice((best.index,), _with_node_fill(best_score, (best,), req, summary, cfg), Locality.GPU)


def _with_node_fill(
    score: float, best: Sequence[GpuState], req: GpuRequest, summary: NodeSummary, cfg: PlacementConfig
) -> float:
    """Blend in how full the node is after placement: binpack (and spread) judge the node too."""
    w_pack, w_spread, _, w_frag = cfg.normalised
    if not summary.healthy:
        return score
    gpu_part = added = 0.0
    took_empty = 0
    for g in best:
        after = _fill_after(g, req)
        gpu_part += after
        added += after - _fill(g)
        took_empty += not g.tenants
    node_fill = (summary.fill_sum + added) / summary.healthy
    # binpack (spread) is half the chosen GPUs' fill, already in `score`, and half the node's fill
    score += 0.5 * (w_pack - w_spread) * ((node_fill if node_fill < 1.0 else 1.0) - gpu_part / len(best))
    if took_empty and w_frag:
        # taking whole GPUs: do it where the fewest stay whole, keeping nodes with many for multi-GPU pods
        score -= 0.5 * w_frag * (summary.empty - took_empty) / summary.healthy
    return 0.0 if score < 0.0 else 1.0 if score > 1.0 else score


def _fill_after(gpu: GpuState, req: GpuRequest) -> float:
    return (
        (gpu.used_memory + req.memory_mib) / gpu.memory_mib
        + min(1.0, (gpu.used_compute + req.compute_percent) / 100.0)
    ) / 2.0


def _locality(gpus: Sequence[GpuState], per_slot: int) -> Locality:
    if len(gpus) <= 1:
        return Locality.GPU
    return Locality.SLOT if len({g.index // per_slot for g in gpus}) == 1 else Locality.MACHINE


def _reason(gpus: Sequence[GpuState], req: GpuRequest, cfg: PlacementConfig, fit: int) -> str:
    reasons: list[str] = []
    for g in gpus:
        r = why_not(g, req, cfg)
        if r is not None:
            reasons.append(r)
            if len(reasons) == 3:
                break
    detail = "; ".join(reasons) if reasons else "no GPUs on the node"
    return f"{fit} of {req.gpus} GPUs fit: {detail}"


def to_priority(score: float) -> int:
    """Map [0, 1] to kube-scheduler's extender priority 0..10."""
    return max(0, min(10, round(score * 10)))
