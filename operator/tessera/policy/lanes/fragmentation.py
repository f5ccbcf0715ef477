"""Fragmentation of GPU nodes against a workload, and FGD's placement rule (Weng et al., ATC'23, §4).

FGD (§4.1-4.2): a node's free GPU share is a *fragment* for a pod shape that cannot use it. For a shape the
node cannot host at all (wrong GPU model, too little CPU, too few GPUs with room) every free GPU share on the
node is a fragment; for a shape it can host, the free share of each GPU too small for the shape is. A node's
fragmentation is the expectation of that amount over the workload's distribution of pod shapes (§4.2,
Eq. 2), and FGD places each pod on the (node, GPUs) where fragmentation grows least (§4.3, Alg. 1). Pods that
ask for no GPU count every free GPU share as a fragment (as the paper's X-axis cases), so they add the same
amount to every candidate and only matter through the CPU they take.

`Measure.fgd()` is that measure exactly. `Measure.tessera()` extends it to what Tessera's lanes and nodes
carry: a GPU can host a shape only with both the compute share and the GPU memory the shape asks for, a node
only with the CPU *and* memory, and the free amount of a GPU is the mean of its free compute share and free
memory fraction (both in GPU units; on Alibaba's trace, where the two are one number, it equals FGD's).

Everything is numpy over many nodes at once: a PackingState holds free compute, free GPU memory, CPU and
memory per node as arrays, so scoring every node for a pod is a few array operations (the extender and the
simulator call the same `score_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
EPS = 1e-9
BIG = 1e15  # CPU milli or memory MiB standing for "no limit"


class PackingInputError(ValueError):
    """A bad shape, node or workload."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A pod's request: `gpus` GPUs (0: CPU-only) with `compute` of each (fraction of its SMs, 0 < c ≤ 1) and
    `gpu_memory_mib` + `gpu_memory_frac` × (that GPU's memory) of each, plus node CPU (milli) and memory (MiB).

    `models`: GPU models the pod may run on (None: any).
    """

    gpus: int
    compute: float
    gpu_memory_mib: float = 0.0
    gpu_memory_frac: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0
    models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise PackingInputError(f"gpus must be >= 0, got {self.gpus}")
        if self.gpus and not 0.0 < self.compute <= 1.0:
            raise PackingInputError(f"compute share must be in (0, 1], got {self.compute}")
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0 or self.gpu_memory_frac < 0:
            raise PackingInputError("CPU, memory and GPU memory requests must be >= 0")

    @staticmethod
    def share(gpus: int, milli: int, cpu_milli: float = 0.0, memory_mib: float = 0.0) -> Shape:
        """A shape as Alibaba's trace writes it: `milli`/1000 of each GPU's compute and memory."""
        if gpus == 0:
            return Shape(0, 0.0, cpu_milli=cpu_milli, memory_mib=memory_mib)
        frac = milli / 1000.0
        return Shape(gpus, frac, gpu_memory_frac=frac, cpu_milli=cpu_milli, memory_mib=memory_mib)

    @property
    def gpu_share(self) -> float:
        """GPUs this shape takes, in GPU units (what the arrived-workload axis adds up)."""
        return self.gpus * self.compute


@dataclass(frozen=True, slots=True)
class Measure:
    """Which dimensions decide whether a GPU or node can host a shape (see the module docstring)."""

    gpu_memory: bool = True  # a GPU needs the shape's memory as well as its compute share
    node_memory: bool = True  # a node needs the shape's memory as well as its CPU

    @staticmethod
    def fgd() -> Measure:
        return Measure(gpu_memory=False, node_memory=False)

    @staticmethod
    def tessera() -> Measure:
        return Measure()


class ShapeMix:
    """A distribution over pod shapes as arrays (weights sum to 1); built by ShapeDistribution."""

    def __init__(self, shapes: Sequence[Shape], weights: Sequence[float], models: Sequence[str]) -> None:
        if len(shapes) != len(weights):
            raise PackingInputError("one weight per shape")
        w = np.asarray(weights, dtype=np.float64)
        if len(w) and (w < 0).any():
            raise PackingInputError("weights must be >= 0")
        total = float(w.sum())
        self.shapes = list(shapes)
        self.weight: F64 = w / total if total > 0 else w
        self.gpus = np.array([s.gpus for s in shapes], dtype=np.float64)
        self.compute = np.array([s.compute for s in shapes], dtype=np.float64)
        self.mem_mib = np.array([s.gpu_memory_mib for s in shapes], dtype=np.float64)
        self.mem_frac = np.array([s.gpu_memory_frac for s in shapes], dtype=np.float64)
        self.cpu = np.array([s.cpu_milli for s in shapes], dtype=np.float64)
        self.memory = np.array([s.memory_mib for s in shapes], dtype=np.float64)
        self.models = list(models)
        # model_ok[m, s]: shape s may run on model id m (the last row: a model the workload never named)
        ok = np.ones((len(self.models) + 1, len(shapes)), dtype=bool)
        for j, s in enumerate(shapes):
            if s.models is not None:
                ok[:, j] = [m in s.models for m in self.models] + [False]
        self.model_ok = ok

    def __len__(self) -> int:
        return len(self.shapes)


@dataclass
class ShapeDistribution:
    """The workload's shape distribution learned online: each observed pod adds weight 1, and all weights
    decay by `decay` per observation (a half-life of ln 2 / (1 − decay) pods), starting from `prior`.

    Shapes whose weight falls below `min_weight` of the total are dropped, and only the `max_shapes` heaviest
    are scored (the tail of a trace adds cost, not information).
    """

    decay: float = 0.999
    max_shapes: int = 64
    min_weight: float = 1e-4
    prior: Sequence[tuple[Shape, float]] = ()
    _w: dict[Shape, float] = field(default_factory=dict, init=False)
    _scale: float = field(default=1.0, init=False)
    _version: int = field(default=0, init=False)
    _built: tuple[int, tuple[str, ...], ShapeMix] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise PackingInputError(f"decay must be in (0, 1], got {self.decay}")
        if self.max_shapes < 1:
            raise PackingInputError("max_shapes must be >= 1")
        for shape, w in self.prior:
            if w < 0:
                raise PackingInputError("prior weights must be >= 0")
            self._w[shape] = self._w.get(shape, 0.0) + w

    def observe(self, shape: Shape) -> None:
        self._scale /= self.decay  # weights are stored × scale: decaying all is one division
        self._w[shape] = self._w.get(shape, 0.0) + self._scale
        self._version += 1
        if self._scale > 1e12 or len(self._w) > 8 * self.max_shapes:
            self._compact()

    def _compact(self) -> None:
        total = sum(self._w.values())
        self._w = {s: w / self._scale for s, w in self._w.items() if w >= self.min_weight * total}
        self._scale = 1.0

    def weights(self) -> dict[Shape, float]:
        return {s: w / self._scale for s, w in self._w.items()}

    def workload(self, models: Sequence[str]) -> ShapeMix:
        """The current distribution as a ShapeMix over `models` (cached until a pod is observed)."""
        key = tuple(models)
        built = self._built
        if built is not None and built[0] == self._version and built[1] == key:
            return built[2]
        total = sum(self._w.values())
        top = sorted(self._w.items(), key=lambda kv: -kv[1])[: self.max_shapes]
        top = [(s, w) for s, w in top if w >= self.min_weight * total]
        wl = ShapeMix([s for s, _ in top], [w for _, w in top], models)
        self._built = (self._version, key, wl)
        return wl


def workload_of(shapes: Iterable[Shape], models: Sequence[str]) -> ShapeMix:
    """The empirical distribution of `shapes` (by count): FGD's target workload (§4.2)."""
    counts: dict[Shape, float] = {}
    for s in shapes:
        counts[s] = counts.get(s, 0.0) + 1.0
    return ShapeMix(list(counts), list(counts.values()), models)


def typical_workload(shapes: Iterable[Shape], models: Sequence[str], popularity: float = 0.95) -> ShapeMix:
    """FGD's target workload as its artifact builds it ("typical pods"): shapes told apart by GPUs, GPU share,
    CPU and GPU models only (not memory), the most frequent first until they cover `popularity` of the pods,
    weights renormalised over those kept (ties in frequency keep first-seen order)."""
    if not 0.0 < popularity <= 1.0:
        raise PackingInputError(f"popularity must be in (0, 1], got {popularity}")
    counts: dict[Shape, float] = {}
    for s in shapes:
        key = Shape(s.gpus, s.compute, s.gpu_memory_mib, s.gpu_memory_frac, s.cpu_milli, 0.0, s.models)
        counts[key] = counts.get(key, 0.0) + 1.0
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: first seen first among equals
    total, kept, cum = sum(counts.values()), [], 0.0
    for s, n in ranked:
        if cum >= popularity * total - EPS:
            break
        kept.append((s, n))
        cum += n
    return ShapeMix([s for s, _ in kept], [n for _, n in kept], models)


def fgd_integer_score(delta: F64) -> F64:
    """FGD's score plugin as its artifact computes it, negated so lower is better: ⌊100·σ(−Δ)⌋ with Δ the
    fragmentation increase in GPUs (σ of the decrease in milli-GPUs / 1000, truncated to kube-scheduler's
    integer 0..100 node score). Increases within ~0.04 GPU of each other tie."""
    out: F64 = -np.floor(100.0 / (1.0 + np.exp(np.clip(delta, -50.0, 50.0))))
    return out


class PackingState:
    """Free resources of many nodes as arrays; row r is one node, column j its j-th GPU.

    comp: free compute share per GPU (−1: no GPU / unhealthy); gfree: free GPU memory MiB (−1 likewise);
    gcap: GPU memory MiB (1 for padding); cpu / mem: free node CPU (milli) and memory (MiB); model: GPU model id
    per node (index into `models`).
    """

    def __init__(self, width: int = 8, capacity: int = 16) -> None:
        self.models: list[str] = []
        self.rows = 0
        self.comp: F64 = np.full((capacity, width), -1.0)
        self.gfree: F64 = np.full((capacity, width), -1.0)
        self.gcap: F64 = np.ones((capacity, width))
        self.cpu: F64 = np.zeros(capacity)
        self.mem: F64 = np.zeros(capacity)
        self.cpu_cap: F64 = np.zeros(capacity)
        self.mem_cap: F64 = np.zeros(capacity)
        self.gpus: F64 = np.zeros(capacity)
        self.model: npt.NDArray[np.intp] = np.zeros(capacity, dtype=np.intp)

    def model_id(self, model: str) -> int:
        if model not in self.models:
            self.models.append(model)
        return self.models.index(model)

    def add_row(self) -> int:
        if self.rows == len(self.cpu):
            self._grow(len(self.cpu), 0)
        self.rows += 1
        return self.rows - 1

    def _grow(self, rows: int, cols: int) -> None:
        pad2 = ((0, rows), (0, cols))
        self.comp = np.pad(self.comp, pad2, constant_values=-1.0)
        self.gfree = np.pad(self.gfree, pad2, constant_values=-1.0)
        self.gcap = np.pad(self.gcap, pad2, constant_values=1.0)
        for name in ("cpu", "mem", "cpu_cap", "mem_cap", "gpus"):
            setattr(self, name, np.pad(getattr(self, name), (0, rows)))
        self.model = np.pad(self.model, (0, rows))

    def set_row(
        self,
        row: int,
        *,
        model: str,
        gpu_memory_mib: Sequence[float],
        free_compute: Sequence[float],
        free_memory_mib: Sequence[float],
        cpu_free: float,
        memory_free: float,
        cpu_capacity: float,
        memory_capacity: float,
    ) -> None:
        """Row `row` from a node's healthy GPUs (capacity, free compute share, free memory) and node resources."""
        n = len(gpu_memory_mib)
        if n > self.comp.shape[1]:
            self._grow(0, n - self.comp.shape[1])
        self.comp[row] = -1.0
        self.gfree[row] = -1.0
        self.gcap[row] = 1.0
        self.comp[row, :n] = free_compute
        self.gfree[row, :n] = free_memory_mib
        self.gcap[row, :n] = gpu_memory_mib
        # no limit (inf) becomes a finite "plenty", so states can be hashed and compared
        self.cpu[row], self.mem[row] = min(cpu_free, BIG), min(memory_free, BIG)
        self.cpu_cap[row], self.mem_cap[row] = min(cpu_capacity, BIG), min(memory_capacity, BIG)
        self.gpus[row] = n
        self.model[row] = self.model_id(model)

    def clear_row(self, row: int) -> None:
        """A row no node uses (nothing fits there)."""
        self.comp[row] = -1.0
        self.gfree[row] = -1.0
        self.gcap[row] = 1.0
        self.cpu[row] = self.mem[row] = -1.0
        self.gpus[row] = 0

    def take(self, row: int, gpus: Sequence[int], shape: Shape) -> None:
        """Allocate `shape` on `row`'s GPUs `gpus` (the caller checked it fits)."""
        for g in gpus:
            self.comp[row, g] -= shape.compute
            self.gfree[row, g] -= shape.gpu_memory_mib + shape.gpu_memory_frac * self.gcap[row, g]
        self.cpu[row] -= shape.cpu_milli
        self.mem[row] -= shape.memory_mib

    def give_back(self, row: int, gpus: Sequence[int], shape: Shape) -> None:
        for g in gpus:
            self.comp[row, g] += shape.compute
            self.gfree[row, g] += shape.gpu_memory_mib + shape.gpu_memory_frac * self.gcap[row, g]
        self.cpu[row] += shape.cpu_milli
        self.mem[row] += shape.memory_mib

    # -- fit --------------------------------------------------------------------------------------
    def gpu_fits(self, rows: npt.NDArray[np.intp], shape: Shape) -> npt.NDArray[np.bool_]:
        """[len(rows), G]: which GPUs have the compute share and GPU memory `shape` asks for."""
        need = shape.gpu_memory_mib + shape.gpu_memory_frac * self.gcap[rows]
        ok: npt.NDArray[np.bool_] = (self.comp[rows] >= shape.compute - EPS) & (
            self.gfree[rows] >= need - EPS
        )
        return ok

    def node_fits(self, rows: npt.NDArray[np.intp], shape: Shape) -> npt.NDArray[np.bool_]:
        """Which rows have the CPU, memory and GPU model `shape` asks for (GPUs aside)."""
        ok: npt.NDArray[np.bool_] = (self.cpu[rows] >= shape.cpu_milli - EPS) & (
            self.mem[rows] >= shape.memory_mib - EPS
        )
        if shape.models is not None:
            allowed = np.array([m in shape.models for m in self.models] + [False])
            ok &= allowed[self.model[rows]]
        return ok

    def feasible(self, rows: npt.NDArray[np.intp], shape: Shape) -> npt.NDArray[np.bool_]:
        """Which rows can host `shape` now: GPU model, CPU, memory and enough GPUs with room."""
        ok = self.node_fits(rows, shape)
        if shape.gpus:
            ok &= np.count_nonzero(self.gpu_fits(rows, shape), axis=1) >= shape.gpus
        return ok

    def free_gpu_share(self, rows: npt.NDArray[np.intp] | None = None) -> F64:
        """Free compute share per row, in GPUs."""
        comp = self.comp[: self.rows] if rows is None else self.comp[rows]
        out: F64 = np.clip(comp, 0.0, None).sum(axis=1)
        return out


def fragmentation(
    comp: F64,
    gfree: F64,
    gcap: F64,
    cpu: F64,
    mem: F64,
    model: npt.NDArray[np.intp],
    wl: ShapeMix,
    measure: Measure,
) -> F64:
    """Each row's expected fragmented GPU share over the workload (FGD §4.2 Eq. 2; see the module docstring).

    Rows are node states (arrays as in PackingState); `model` ids index `wl.model_ok`, where ids the workload
    does not know map to its last row (only shapes without a model constraint run there).
    """
    healthy = comp >= 0.0
    if measure.gpu_memory:
        amount = np.where(healthy, (np.clip(comp, 0, None) + np.clip(gfree, 0, None) / gcap) / 2.0, 0.0)
    else:
        amount = np.where(healthy, np.clip(comp, 0, None), 0.0)
    total = amount.sum(axis=1)  # [R]
    if not len(wl):
        out: F64 = np.zeros(len(comp))
        return out
    fit = comp[:, :, None] >= wl.compute[None, None, :] - EPS  # [R, G, S]
    if measure.gpu_memory:
        need = wl.mem_mib[None, None, :] + wl.mem_frac[None, None, :] * gcap[:, :, None]
        fit &= gfree[:, :, None] >= need - EPS
    fitf = fit.astype(np.float64)
    usable = np.einsum("rg,rgs->rs", amount, fitf)  # free share on GPUs the shape fits
    count = fitf.sum(axis=1)  # [R, S]
    hosted = (count >= wl.gpus[None, :]) & (wl.gpus[None, :] > 0)
    hosted &= cpu[:, None] >= wl.cpu[None, :] - EPS
    if measure.node_memory:
        hosted &= mem[:, None] >= wl.memory[None, :] - EPS
    known = np.where(model < len(wl.models), model, len(wl.models))
    hosted &= wl.model_ok[known]
    frag = total[:, None] - np.where(hosted, usable, 0.0)
    res: F64 = frag @ wl.weight
    return res


def model_map(state: PackingState, wl: ShapeMix) -> npt.NDArray[np.intp]:
    """state model id → workload model id (len(wl.models) for models the workload does not name)."""
    index = {m: i for i, m in enumerate(wl.models)}
    return np.array([index.get(m, len(wl.models)) for m in state.models] or [0], dtype=np.intp)


@dataclass(frozen=True)
class RowScores:
    """Per feasible row: the best GPU choice's fragmentation increase; `gpus_of(i)` gives row i's GPUs."""

    state: PackingState
    rows: npt.NDArray[np.intp]
    delta: F64
    free_after: F64  # free GPU share of the row after placement (the tie-break of Tessera's rule)
    reps: npt.NDArray[np.intp]  # the row scored for each group of rows in the same state
    group: npt.NDArray[np.intp]  # rows[i] is in group group[i]
    rep_gpus: list[tuple[int, ...]]

    def gpus_of(self, i: int) -> tuple[int, ...]:
        """GPU columns chosen on rows[i]: its group's choice, mapped to GPUs in the same free state."""
        g = int(self.group[i])
        return _same_gpus(self.state, int(self.rows[i]), self.rep_gpus[g], int(self.reps[g]))


_PROJECTION = np.random.default_rng(20230710).uniform(0.5, 1.5, size=4096)


def _groups(
    state: PackingState, rows: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Rows in the same state (sorted free GPUs, GPU sizes, CPU, memory, model) score alike: (the first row of
    each group, each row's group). States are told apart by a random projection (equal states, equal sums)."""
    feats = np.concatenate(
        [
            np.sort(state.comp[rows], axis=1),
            np.sort(state.gfree[rows] / state.gcap[rows], axis=1),
            np.sort(state.gcap[rows], axis=1),
            state.cpu[rows, None],
            state.mem[rows, None],
            state.model[rows, None].astype(np.float64),
        ],
        axis=1,
    )
    h = feats @ _PROJECTION[: feats.shape[1]]
    _, first, group = np.unique(h, return_index=True, return_inverse=True)
    return rows[first], group.reshape(-1)


def _candidates(
    state: PackingState, reps: npt.NDArray[np.intp], shape: Shape
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """GPU choices worth scoring on each representative row: (owner index into reps, chosen columns [C, k]).

    One-GPU pods: every fitting GPU, less those in the same free state as a lower-index one (they score
    alike). k GPUs: the k fitting GPUs with the least free compute (tightest; any k idle ones for whole-GPU
    pods). CPU-only pods: one choice, no GPU.
    """
    u = len(reps)
    if not shape.gpus:
        return np.arange(u, dtype=np.intp), np.zeros((u, 0), dtype=np.intp)
    fits = state.gpu_fits(reps, shape)
    if shape.gpus == 1:
        comp, gfree = state.comp[reps], state.gfree[reps]
        same = (comp[:, :, None] == comp[:, None, :]) & (gfree[:, :, None] == gfree[:, None, :])
        earlier = np.tril(np.ones((comp.shape[1], comp.shape[1]), dtype=bool), k=-1)  # [j, j'] j' < j
        dup = (same & earlier[None] & fits[:, None, :]).any(axis=2)
        owner, col = np.nonzero(fits & ~dup)
        return owner.astype(np.intp), col.astype(np.intp)[:, None]
    key = np.where(fits, state.comp[reps], np.inf)
    cols = np.argsort(key, axis=1, kind="stable")[:, : shape.gpus]
    return np.arange(u, dtype=np.intp), np.sort(cols, axis=1).astype(np.intp)


class _FragModel:
    """Fragmentation against the workload's shape mix in the measure's dimensions (FGD §4.2), over arrays of
    GPUs ([..., G]) and of nodes ([U])."""

    def __init__(self, wl: ShapeMix, measure: Measure) -> None:
        self.wl, self.measure = wl, measure
        self.w_gpus = wl.gpus[None, :]

    def amount(self, c: F64, m: F64, cap: F64) -> F64:
        """The free amount a GPU (free compute c, memory m, size cap) counts for; 0 for a failed GPU."""
        healthy = c >= 0.0
        if self.measure.gpu_memory:
            out: F64 = np.where(healthy, (np.clip(c, 0, None) + np.clip(m, 0, None) / cap) / 2.0, 0.0)
        else:
            out = np.where(healthy, np.clip(c, 0, None), 0.0)
        return out

    def gpu_fit(self, c: F64, m: F64, cap: F64) -> npt.NDArray[np.float64]:
        """[..., S] 1.0 where a GPU (free compute c, memory m, size cap) fits each shape."""
        wl = self.wl
        ok = c[..., None] >= wl.compute - EPS
        if self.measure.gpu_memory:
            ok &= m[..., None] >= wl.mem_mib + wl.mem_frac * cap[..., None] - EPS
        out: npt.NDArray[np.float64] = ok.astype(np.float64)
        return out

    def node_ok(self, cpu: F64, mem: F64, model: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
        """[U, S] whether each node's CPU, memory and GPU model admit each shape."""
        wl = self.wl
        ok = (cpu[:, None] >= wl.cpu[None, :] - EPS) & wl.model_ok[model] & (self.w_gpus > 0)
        if self.measure.node_memory:
            ok &= mem[:, None] >= wl.memory[None, :] - EPS
        return ok

    def frag(self, total: F64, usable: F64, count: F64, ok: npt.NDArray[np.bool_]) -> F64:
        """[U] expected fragmentation: the free amount no shape, weighted by popularity, can use."""
        hosted = ok & (count >= self.w_gpus - EPS)
        out: F64 = (total[:, None] - np.where(hosted, usable, 0.0)) @ self.wl.weight
        return out


def score_rows(
    state: PackingState,
    rows: npt.NDArray[np.intp],
    shape: Shape,
    wl: ShapeMix,
    measure: Measure,
    quantize: Callable[[F64], F64] | None = None,
) -> RowScores:
    """FGD's score for placing `shape` on each of `rows` that can host it (the others are left out).

    For every row the candidate GPU choices are scored by fragmentation after minus before (§4.3), and the
    least increase is the row's (the first candidate, in column order, on ties). Rows in the same state are
    scored once. A choice changes a few GPUs of a node, so the state after is computed from the state before
    GPU by GPU rather than from scratch: the cost is (rows × GPUs + choices) × shapes.

    `quantize` maps each choice's increase to what is compared instead (lower is better), e.g. FGD's integer
    score (`fgd_integer_score`); the rows' `delta` is then that value.
    """
    rows = rows[state.feasible(rows, shape)]
    if not len(rows):
        empty = np.zeros(0, dtype=np.intp)
        return RowScores(state, rows, np.zeros(0), np.zeros(0), empty, empty, [])
    reps, group = _groups(state, rows)
    owner, chosen = _candidates(state, reps, shape)
    fm = _FragModel(wl, measure)
    comp, gfree, gcap = state.comp[reps], state.gfree[reps], state.gcap[reps]
    known = model_map(state, wl)[state.model[reps]]
    a = fm.amount(comp, gfree, gcap)  # [U, G]
    fit = fm.gpu_fit(comp, gfree, gcap)  # [U, G, S]
    usable = np.einsum("ug,ugs->us", a, fit)
    count = fit.sum(axis=1)
    total = a.sum(axis=1)
    before = (
        fm.frag(total, usable, count, fm.node_ok(state.cpu[reps], state.mem[reps], known))
        if len(wl)
        else total * 0
    )
    # the state after each choice, from the state before, one changed GPU at a time
    u_total, u_usable, u_count = total[owner].copy(), usable[owner].copy(), count[owner].copy()
    for t in range(chosen.shape[1]):
        g = chosen[:, t]
        c_old, m_old, cap = comp[owner, g], gfree[owner, g], gcap[owner, g]
        c_new = c_old - shape.compute
        m_new = m_old - (shape.gpu_memory_mib + shape.gpu_memory_frac * cap)
        a_old, a_new = a[owner, g], fm.amount(c_new, m_new, cap)
        f_old, f_new = fit[owner, g], fm.gpu_fit(c_new, m_new, cap)
        u_total += a_new - a_old
        u_usable += a_new[:, None] * f_new - a_old[:, None] * f_old
        u_count += f_new - f_old
    if len(wl):
        cpu_after, mem_after = (
            state.cpu[reps][owner] - shape.cpu_milli,
            state.mem[reps][owner] - shape.memory_mib,
        )
        after = fm.frag(u_total, u_usable, u_count, fm.node_ok(cpu_after, mem_after, known[owner]))
    else:
        after = u_total * 0
    delta_c = after - before[owner]
    if quantize is not None:
        delta_c = quantize(delta_c)
    free_c = np.clip(comp, 0, None).sum(axis=1)[owner] - shape.compute * shape.gpus
    best = _least_per_owner(delta_c, owner)
    rep_gpus = [tuple(int(x) for x in chosen[j]) for j in best.tolist()]
    return RowScores(state, rows, delta_c[best][group], free_c[best][group], reps, group, rep_gpus)


def _least_per_owner(delta: F64, owner: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """Per owner, the index of its least `delta` (equal up to float noise), the first listed on ties."""
    order = np.lexsort((np.arange(len(owner)), np.round(delta / EPS), owner))
    _, first = np.unique(owner[order], return_index=True)
    best: npt.NDArray[np.intp] = order[first]
    return best


def _same_gpus(state: PackingState, row: int, rep_choice: tuple[int, ...], rep: int) -> tuple[int, ...]:
    """The representative's GPU choice carried over to a row in the same state (same free values)."""
    if row == rep:
        return rep_choice
    out: list[int] = []
    for g in rep_choice:
        want = (state.comp[rep, g], state.gfree[rep, g] / state.gcap[rep, g])
        for c in range(state.comp.shape[1]):
            if c in out:
                continue
            if (
                abs(state.comp[row, c] - want[0]) < EPS
                and abs(state.gfree[row, c] / state.gcap[row, c] - want[1]) < EPS
            ):
                out.append(c)
                break
    return tuple(sorted(out))
