"""Algorithm 2: enumerate model buckets, device buckets, group partitions and parallel configs, run
Algorithm 1 (or the fast heuristic) on each, keep the best (AlpaServe §4.2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tessera.policy.serving.alpaserve.greedy import Scored, evaluate, fast_greedy_selection, greedy_selection
from tessera.policy.serving.alpaserve.placement import MemoryRule, ModelPlacement
from tessera.policy.serving.alpaserve.profiles import ModelProfile, ParallelConfig
from tessera.policy.serving.alpaserve.workload import Workload

log = logging.getLogger(__name__)

BucketOrder = Literal["latency_desc", "input"]


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of the search; defaults follow the paper and the authors' code (alpa-projects/mms)."""

    max_pp: int = 8
    max_op: int = 4  # the authors' code's default; the paper's S4 answer needs 8 (§6.3)
    devices_per_node: int = 8
    beam_size: int = 1  # Alg. 1 default (AlpaServe §4.2)
    fast_heuristic: bool = True  # the authors' search uses the fast greedy
    bucket_threshold: float = 0.38  # the authors' code; the paper gives no value
    bucket_order: BucketOrder = "latency_desc"  # Tessera's choice: canonical order
    try_mixed: bool = True  # the authors' code also tries all models in one bucket
    memory_rule: MemoryRule = "per_stage"
    fixed_overhead_s: float = 0.0
    prune_taus: tuple[float, ...] = (1.0, 0.5, 0.3, 0.2, 0.1)
    max_device_partitions: int = 100
    group_sizes: tuple[int, ...] | None = None  # restrict group sizes (e.g. ablations); None = all

    def __post_init__(self) -> None:
        if min(self.max_pp, self.max_op, self.devices_per_node, self.beam_size) < 1:
            raise ValueError("max_pp, max_op, devices_per_node and beam_size must all be ≥ 1")
        if self.max_op > self.devices_per_node:
            raise ValueError(
                f"max_op {self.max_op} exceeds devices_per_node {self.devices_per_node}: intra-op "
                "parallelism must stay within a node"
            )
        if self.bucket_threshold <= 0:
            raise ValueError("bucket_threshold must be positive")


@dataclass(frozen=True)
class SearchResult:
    placement: ModelPlacement
    best: Scored
    simulations: int
    candidates: int
    buckets: list[list[str]] = field(default_factory=list)

    @property
    def attainment(self) -> float:
        return self.best.attainment


def bucket_models(
    profiles: Sequence[ModelProfile], threshold: float = 0.38, order: BucketOrder = "latency_desc"
) -> list[list[str]]:
    """``enumerate_separations`` of the authors' code (alpa-projects/mms): a model joins the first bucket whose first member's
    latency is within ``threshold`` (relative), else opens a new bucket. Separates models whose latency
    differs a lot, against the convoy effect (AlpaServe §4.2). Order-dependent; "latency_desc" makes it
    canonical, "input" keeps the given order."""
    seq = list(profiles)
    if order == "latency_desc":
        seq.sort(key=lambda p: -p.latency_s)  # stable: equal latencies keep input order
    elif order != "input":
        raise ValueError(f"unknown bucket order {order!r}; use 'latency_desc' or 'input'")
    buckets: list[list[ModelProfile]] = []
    for p in seq:
        for b in buckets:
            if abs(p.latency_s - b[0].latency_s) / b[0].latency_s < threshold:
                b.append(p)
                break
        else:
            buckets.append([p])
    return [[p.name for p in b] for b in buckets]


def device_partitions(n: int, k: int, devices_per_node: int = 8) -> list[tuple[int, ...]]:
    """``get_partitions`` of the authors' code: ordered k-part compositions of n devices keeping node alignment — a part
    of size s is allowed iff s ≤ n mod node, (n − s) mod node = 0, or n mod node = 0."""
    if k < 1 or n < k:
        return []
    if k == 1:
        return [(n,)]
    out: list[tuple[int, ...]] = []
    rem = n % devices_per_node
    for s in range(1, n - k + 2):
        if not (s <= rem or (n - s) % devices_per_node == 0 or rem == 0):
            continue
        out.extend((s, *rest) for rest in device_partitions(n - s, k - 1, devices_per_node))
    return out


def prune_device_partitions(
    buckets: Sequence[Sequence[ModelProfile]],
    partitions: Sequence[tuple[int, ...]],
    rates: Mapping[str, float],
    taus: Sequence[float] = (1.0, 0.5, 0.3, 0.2, 0.1),
    limit: int = 100,
) -> list[tuple[int, ...]]:
    """Drop device splits whose capacity share differs from the bucket's demand share by ≥ τ, trying
    τ in order until fewer than ``limit`` remain (AlpaServe §4.2 pruning, in the authors' code's form)."""
    total = sum(rates.get(p.name, 0.0) for b in buckets for p in b) or 1.0
    demand = [sum(rates.get(p.name, 0.0) for p in b) / total for b in buckets]
    kept = list(partitions)
    for tau in taus:
        cur = []
        for part in partitions:
            cap = [h / b[0].latency_s for h, b in zip(part, buckets, strict=True)]
            s = sum(cap)
            if max(abs(d - c / s) for d, c in zip(demand, cap, strict=True)) < tau:
                cur.append(part)
        if not cur:
            break  # a tighter τ leaves nothing: keep the last non-empty set
        kept = cur
        if len(cur) < limit:
            break
    return kept


def group_configs(n: int, opts: SearchOptions) -> list[list[ParallelConfig]]:
    """``enumerate_group_configs_uneven`` of the authors' code: equal groups of a power-of-two size with one
    shared (pp, op), plus leftover groups from the binary decomposition of n mod size as pipelines."""
    node = opts.devices_per_node
    out: list[list[ParallelConfig]] = []
    size = 1
    while size <= n:
        allowed = opts.group_sizes is None or size in opts.group_sizes
        if allowed and not (size > node and size % node != 0):
            n_reg, left = divmod(n, size)
            leftover: list[ParallelConfig] = []
            bit = 1 << max(left.bit_length() - 1, 0)
            ok = True
            while left:
                if left & bit:
                    pp = min(bit, opts.max_pp)
                    op = bit // pp
                    if op > opts.max_op:
                        ok = False
                    leftover.append(ParallelConfig(pp, op))
                    left -= bit
                bit >>= 1
            pp = 1
            while ok and pp <= size:
                op = size // pp
                if pp <= opts.max_pp and op <= opts.max_op:
                    out.append([ParallelConfig(pp, op)] * n_reg + leftover)
                pp *= 2
        size *= 2
    return out


Select = Callable[[Sequence[str], ModelPlacement, Workload], Scored]


def _selector(profiles: Mapping[str, ModelProfile], budget_bytes: float, opts: SearchOptions) -> Select:
    def select(models: Sequence[str], base: ModelPlacement, w: Workload) -> Scored:
        if opts.fast_heuristic:
            return fast_greedy_selection(
                models, base, profiles, w, budget_bytes,
                memory_rule=opts.memory_rule, fixed_overhead_s=opts.fixed_overhead_s,
            )  # fmt: skip
        return greedy_selection(
            models, base, profiles, w, budget_bytes,
            beam_size=opts.beam_size, memory_rule=opts.memory_rule, fixed_overhead_s=opts.fixed_overhead_s,
        )  # fmt: skip

    return select


def place_bucket(
    models: Sequence[str],
    num_devices: int,
    first_device: int,
    profiles: Mapping[str, ModelProfile],
    workload: Workload,
    budget_bytes: float,
    opts: SearchOptions,
) -> tuple[Scored, int, int]:
    """Alg. 2 lines 8–15 for one bucket on devices [first_device, first_device + num_devices)."""
    select = _selector(profiles, budget_bytes, opts)
    w = workload.only(models)
    best: Scored | None = None
    sims = cands = 0
    for configs in group_configs(num_devices, opts):
        r = select(models, ModelPlacement.empty(configs, first_device), w)
        sims += r.simulations
        cands += 1
        if best is None or r.score > best.score:
            best = r
    if best is None:
        raise ValueError(
            f"no group configuration fits {num_devices} devices with max_pp={opts.max_pp}, "
            f"max_op={opts.max_op}"
        )
    return best, sims, cands


def place(
    profiles: Sequence[ModelProfile],
    num_devices: int,
    workload: Workload,
    budget_bytes: float,
    opts: SearchOptions | None = None,
    *,
    on_step: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Algorithm 2: the AlpaServe placement for ``profiles`` on ``num_devices`` devices."""
    opts = opts or SearchOptions()
    if num_devices < 1:
        raise ValueError(f"need at least one device, got {num_devices}")
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    by_name = {p.name: p for p in profiles}
    separated = bucket_models(profiles, opts.bucket_threshold, opts.bucket_order)
    bucketings = [separated]
    if opts.try_mixed and len(separated) > 1:
        bucketings.append([sorted(names, key=lambda m: -by_name[m].latency_s)])
    rates = workload.rates()
    plans: list[tuple[list[list[str]], tuple[int, ...]]] = []
    for buckets in bucketings:
        parts = device_partitions(num_devices, len(buckets), opts.devices_per_node)
        parts = prune_device_partitions(
            [[by_name[m] for m in b] for b in buckets], parts, rates,
            opts.prune_taus, opts.max_device_partitions,
        )  # fmt: skip
        plans.extend((buckets, p) for p in parts)
    cache: dict[tuple[tuple[str, ...], int, int], tuple[Scored, int, int]] = {}
    best: Scored | None = None
    best_buckets: list[list[str]] = []
    sims = cands = 0
    for step, (buckets, part) in enumerate(plans):
        pieces: list[ModelPlacement] = []
        offset = 0
        for b, h in zip(buckets, part, strict=True):
            key = (tuple(b), h, offset)
            if key not in cache:
                cache[key] = place_bucket(b, h, offset, by_name, workload, budget_bytes, opts)
                sims += cache[key][1]
                cands += cache[key][2]
            pieces.append(cache[key][0].placement)
            offset += h
        plm = ModelPlacement(tuple(g for p in pieces for g in p.groups))
        scored = evaluate(plm, by_name, workload, fixed_overhead_s=opts.fixed_overhead_s)
        sims += 1
        if best is None or scored.score > best.score:
            best, best_buckets = scored, buckets
        if on_step:
            on_step(step + 1, len(plans))
    if best is None:
        raise ValueError(f"no way to split {num_devices} devices over {len(separated)} model buckets")
    log.info("placement search: %d candidates, %d simulations, attainment %.4f", cands, sims, best.attainment)
    return SearchResult(best.placement, best, sims, cands, best_buckets)
