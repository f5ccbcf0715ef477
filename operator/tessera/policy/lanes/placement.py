"""Choosing GPUs on a node for a pod: fit, Orion-style interference rules, and four scores.

Fit: each chosen GPU is healthy and has the memory and compute share the pod asks for.

Interference (Orion, spec B.1/C.3): a workload has a profile — the fraction of its GPU time that is
compute-bound (1.0 compute-bound, 0.0 memory-bound, or a measured value; unknown counts as 0.5) — and a
class, latency-critical (HP) or best-effort (BE).
- At most `max_latency_critical_per_gpu` (default 1, Orion's single HP client) LC pods per GPU.
- Best-effort work may overcommit compute on GPUs without LC work (`best_effort_overcommit`), but never on a
  GPU with an LC pod: there the shares must add up to ≤ 100 so the LC lane keeps its share.
- Complementary profiles are preferred: 1 − |c_a − (1 − c_b)| (spec C.3(e)); Conv2d–BN2d collocation gave
  1.41× vs 0.98× for Conv2d–Conv2d (Table 2 [O:L119-L130]).

Scores (each in [0, 1], higher is better), combined by weights:
- binpack: how full the GPUs are after placement; spread: how empty.
- interference: the mean complementarity with the pods already on the chosen GPUs (0.5, neutral, when
  alone, so a complementary partner is preferred to an empty GPU and an empty GPU to a same-kind one).
- fragmentation: 1 minus the penalty for what the placement leaves behind: a sliver of memory or compute
  below `sliver_fraction` of the GPU (usable by nobody), and stranded capacity (free memory without free
  compute or the reverse: |free memory fraction − free compute fraction|).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

WorkloadClass = Literal["latency-critical", "best-effort"]
Strategy = Literal["binpack", "spread", "interference", "fragmentation"]
STRATEGIES: tuple[Strategy, ...] = ("binpack", "spread", "interference", "fragmentation")


class PlacementError(ValueError):
    """Bad placement input (negative request, unknown strategy)."""


@dataclass(frozen=True)
class Tenant:
    """A pod already on a GPU, as the scorer needs it."""

    memory_mib: int
    compute_percent: int
    compute_fraction: float = 0.5
    workload_class: WorkloadClass = "best-effort"


@dataclass
class GpuState:
    index: int
    uuid: str
    memory_mib: int
    healthy: bool = True
    tenants: list[Tenant] = field(default_factory=list)

    @property
    def used_memory(self) -> int:
        return sum(t.memory_mib for t in self.tenants)

    @property
    def used_compute(self) -> int:
        return sum(t.compute_percent for t in self.tenants)

    @property
    def latency_critical(self) -> int:
        return sum(1 for t in self.tenants if t.workload_class == "latency-critical")


@dataclass(frozen=True)
class Request:
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
        ("interference", 1.0),
        ("fragmentation", 1.0),
    )
    max_latency_critical_per_gpu: int = 1
    best_effort_overcommit: float = 1.0  # ≥ 1: how far BE-only GPUs' compute shares may add up past 100%
    sliver_fraction: float = 0.1

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


def complementarity(a: float, b: float) -> float:
    """1 − |c_a − (1 − c_b)|: 1 for a compute-bound and a memory-bound pair, 0 for two of the same kind."""
    return 1.0 - abs(a - (1.0 - b))


def why_not(gpu: GpuState, req: Request, cfg: PlacementConfig) -> str | None:
    """None when the request fits on `gpu`; otherwise the reason it does not."""
    if not gpu.healthy:
        return f"GPU {gpu.index} is unhealthy"
    free_mem = gpu.memory_mib - gpu.used_memory
    if req.memory_mib > free_mem:
        return f"GPU {gpu.index} has {free_mem} MiB free, pod needs {req.memory_mib}"
    lc_here = gpu.latency_critical + (req.workload_class == "latency-critical")
    if req.workload_class == "latency-critical" and lc_here > cfg.max_latency_critical_per_gpu:
        return f"GPU {gpu.index} already has a latency-critical pod"
    limit = 100.0 if lc_here else 100.0 * cfg.best_effort_overcommit
    if gpu.used_compute + req.compute_percent > limit + 1e-9:
        what = "would take the latency-critical lane below its share" if lc_here else "has too little compute"
        return f"GPU {gpu.index} {what} ({gpu.used_compute}% used, pod needs {req.compute_percent}%)"
    return None


def gpu_scores(gpu: GpuState, req: Request, cfg: PlacementConfig) -> dict[Strategy, float]:
    mem_after = (gpu.used_memory + req.memory_mib) / gpu.memory_mib
    comp_after = min(1.0, (gpu.used_compute + req.compute_percent) / 100.0)
    fill = (mem_after + comp_after) / 2.0
    if gpu.tenants:
        inter = sum(complementarity(req.compute_fraction, t.compute_fraction) for t in gpu.tenants) / len(
            gpu.tenants
        )
    else:
        inter = 0.5  # neutral: a complementary partner beats an empty GPU, a same-kind one does not
    free_mem, free_comp = 1.0 - mem_after, 1.0 - comp_after
    sliver = sum(1.0 for f in (free_mem, free_comp) if 1e-9 < f < cfg.sliver_fraction) / 2.0
    stranded = abs(free_mem - free_comp)
    return {
        "binpack": fill,
        "spread": 1.0 - fill,
        "interference": inter,
        "fragmentation": max(0.0, 1.0 - (sliver + stranded) / 2.0),
    }


def combined(scores: dict[Strategy, float], cfg: PlacementConfig) -> float:
    total = sum(w for _, w in cfg.weights)
    if total == 0:
        return 0.0
    return sum(scores[name] * w for name, w in cfg.weights) / total


@dataclass(frozen=True)
class Choice:
    gpu_indices: tuple[int, ...]
    score: float  # in [0, 1]


def choose_gpus(
    gpus: Sequence[GpuState],
    req: Request,
    cfg: PlacementConfig,
    *,
    only: Sequence[int] | None = None,
) -> Choice | str:
    """The best `req.gpus` GPUs (by combined score) or the reason none fit. `only`: GPUs fixed by a placement."""
    candidates = list(gpus)
    if only is not None:
        by_index = {g.index: g for g in gpus}
        missing = [i for i in only if i not in by_index]
        if missing:
            return f"placement names GPU index {missing[0]}, which the node does not have"
        if len(only) != req.gpus:
            return f"placement names {len(only)} GPUs but the pod asks for {req.gpus}"
        candidates = [by_index[i] for i in only]
    scored: list[tuple[float, int]] = []
    reasons: list[str] = []
    for gpu in candidates:
        reason = why_not(gpu, req, cfg)
        if reason is None:
            scored.append((combined(gpu_scores(gpu, req, cfg), cfg), gpu.index))
        else:
            reasons.append(reason)
    if len(scored) < req.gpus:
        detail = "; ".join(reasons[:3]) if reasons else "no GPUs on the node"
        return f"{len(scored)} of {req.gpus} GPUs fit: {detail}"
    scored.sort(key=lambda s: (-s[0], s[1]))
    best = scored[: req.gpus]
    score = sum(s for s, _ in best) / req.gpus
    # Binpack also across the node: prefer nodes already in use, keeping whole nodes free for gangs.
    w_pack = dict(cfg.weights).get("binpack", 0.0) - dict(cfg.weights).get("spread", 0.0)
    total = sum(w for _, w in cfg.weights)
    if w_pack and total and gpus:
        fill = sum(g.used_memory / g.memory_mib for g in gpus) / len(gpus)
        score = min(1.0, max(0.0, score + 0.5 * (w_pack / total) * (fill - 0.5)))
    return Choice(tuple(sorted(i for _, i in best)), score)


def to_priority(score: float) -> int:
    """Map [0, 1] to kube-scheduler's extender priority 0..10."""
    return max(0, min(10, round(score * 10)))
