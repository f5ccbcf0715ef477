"""Model profiles: per-parallel-configuration stage latencies and per-device weight memory.

A profile is what AlpaServe's auto-paralleliser hands the placement search (AlpaServe
§4.1): for each candidate configuration ``(pp, op)`` the latency of every pipeline stage and the
weight bytes every device of that stage holds. Without GPUs we synthesise profiles from a single-device
latency with the α-model (AlpaServe §3.3); such profiles are flagged ``synthetic``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class ParallelConfig:
    """``pp`` inter-op (pipeline) stages, each ``op``-way intra-op parallel; group size ``pp·op``.

    Paper notation "(8,2)" is ``ParallelConfig(pp=8, op=2)`` (AlpaServe Fig. 13 caption).
    """

    pp: int
    op: int = 1

    def __post_init__(self) -> None:
        if self.pp < 1 or self.op < 1:
            raise ValueError(f"parallel config needs pp ≥ 1 and op ≥ 1, got pp={self.pp}, op={self.op}")

    @property
    def size(self) -> int:
        return self.pp * self.op

    def __str__(self) -> str:
        return f"({self.pp},{self.op})"


@dataclass(frozen=True)
class StageProfile:
    """Stage latencies (s), per-device weight bytes per stage, and optional non-blocking delays.

    ``stage_comm_s[k]`` is a transfer after stage ``k`` that delays the request but does not hold a
    device (Tessera's option, for the Fig. 1 arithmetic). Empty means none (the authors' code's default:
    all overhead folded into blocking stage latencies).
    """

    stage_latency_s: tuple[float, ...]
    stage_weight_bytes: tuple[float, ...]
    stage_comm_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.stage_latency_s)
        if n == 0:
            raise ValueError("a stage profile needs at least one stage latency")
        if len(self.stage_weight_bytes) != n:
            raise ValueError(
                f"stage profile has {n} stage latencies but {len(self.stage_weight_bytes)} stage weight sizes"
            )
        if self.stage_comm_s and len(self.stage_comm_s) != n - 1:
            raise ValueError(f"stage_comm_s must have pp−1 = {n - 1} entries, got {len(self.stage_comm_s)}")
        if any(x <= 0 for x in self.stage_latency_s):
            raise ValueError(f"stage latencies must be positive, got {self.stage_latency_s}")
        if any(x < 0 for x in (*self.stage_weight_bytes, *self.stage_comm_s)):
            raise ValueError("stage weight sizes and communication delays must be non-negative")

    @property
    def pp(self) -> int:
        return len(self.stage_latency_s)

    @property
    def single_input_latency_s(self) -> float:
        """D_s: latency of one request through an empty pipeline (AlpaServe §3.4)."""
        return sum(self.stage_latency_s) + sum(self.stage_comm_s)

    @property
    def max_stage_latency_s(self) -> float:
        """D_m: the bottleneck stage, which bounds throughput at 1/D_m (AlpaServe §3.3)."""
        return max(self.stage_latency_s)


@dataclass(frozen=True)
class ModelProfile:
    """One servable model: name, single-device latency L_m (drives SLO scale and bucketing), total weight
    bytes, and its candidate parallel configurations."""

    name: str
    latency_s: float
    weight_bytes: float
    configs: Mapping[ParallelConfig, StageProfile] = field(default_factory=dict)
    synthetic: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a model profile needs a non-empty name")
        if self.latency_s <= 0:
            raise ValueError(f"model {self.name!r}: latency must be positive, got {self.latency_s}")
        for cfg, stages in self.configs.items():
            if stages.pp != cfg.pp:
                raise ValueError(
                    f"model {self.name!r}: config {cfg} has {stages.pp} stage latencies, expected {cfg.pp}"
                )

    def stages(self, cfg: ParallelConfig) -> StageProfile:
        try:
            return self.configs[cfg]
        except KeyError:
            known = ", ".join(str(c) for c in sorted(self.configs)) or "none"
            raise KeyError(f"model {self.name!r} has no profile for config {cfg} (has: {known})") from None

    def supports(self, cfg: ParallelConfig) -> bool:
        return cfg in self.configs


def synthetic_stage_profile(
    latency_s: float,
    weight_bytes: float,
    cfg: ParallelConfig,
    *,
    inter_op_overhead: float = 0.009,
    intra_op_comm: float = 0.1,
) -> StageProfile:
    """The α-model (AlpaServe §3.3) with the per-stage penalty of the authors' code (alpa-projects/mms).

    Each of ``pp`` equal stages takes ``α_pp·L/pp`` with ``α_pp = 1 + inter_op_overhead·(pp−1)``
    [OURS: the (1,1) profile is exactly the measured L]; intra-op splits a stage ``op`` ways and adds
    collective communication ``intra_op_comm·(L/pp)·(op−1)/op``. Weights are sharded ``W/(pp·op)``.
    """
    if latency_s <= 0 or weight_bytes < 0:
        raise ValueError("synthetic profile needs a positive latency and non-negative weight size")
    alpha = 1.0 + inter_op_overhead * (cfg.pp - 1)
    per_stage = latency_s / cfg.pp
    stage = alpha * per_stage / cfg.op + intra_op_comm * per_stage * (cfg.op - 1) / cfg.op
    return StageProfile((stage,) * cfg.pp, (weight_bytes / cfg.size,) * cfg.pp)


def synthetic_profile(
    name: str,
    latency_s: float,
    weight_bytes: float,
    configs: Iterable[ParallelConfig],
    *,
    inter_op_overhead: float = 0.009,
    intra_op_comm: float = 0.1,
) -> ModelProfile:
    """A profile for every config in ``configs``, marked synthetic."""
    table = {
        cfg: synthetic_stage_profile(
            latency_s, weight_bytes, cfg, inter_op_overhead=inter_op_overhead, intra_op_comm=intra_op_comm
        )
        for cfg in configs
    }
    return ModelProfile(name, latency_s, weight_bytes, table, synthetic=True)


def all_configs(max_pp: int, max_op: int) -> list[ParallelConfig]:
    """Every (pp, op) with pp ≤ max_pp and op ≤ max_op, both powers of two (as the authors' code enumerates them)."""
    pps = [1 << i for i in range(max_pp.bit_length()) if (1 << i) <= max_pp]
    ops = [1 << i for i in range(max_op.bit_length()) if (1 << i) <= max_op]
    return [ParallelConfig(pp, op) for pp in pps for op in ops]


def partition_stages(layer_latency_s: Sequence[float], stages: int) -> tuple[float, list[tuple[int, int]]]:
    """Serving DP of AlpaServe §4.1: slice layers into ``stages`` non-empty stages
    minimising the maximal stage latency, with latency(i, k) = Σ layer latencies.

    ``F(s,k) = min_{1≤i≤k} max{F(s−1,i−1), latency(i,k)}``, ``F(0,0)=0``, other boundaries +∞.
    Returns the optimum and the 1-based inclusive ``(first, last)`` layer range of each stage. O(S·K²).
    """
    k_layers = len(layer_latency_s)
    if stages < 1 or stages > k_layers:
        raise ValueError(f"cannot cut {k_layers} layers into {stages} non-empty stages")
    prefix = [0.0]
    for x in layer_latency_s:
        if x < 0:
            raise ValueError(f"layer latencies must be non-negative, got {x}")
        prefix.append(prefix[-1] + x)
    inf = float("inf")
    f = [[inf] * (k_layers + 1) for _ in range(stages + 1)]
    arg = [[0] * (k_layers + 1) for _ in range(stages + 1)]
    f[0][0] = 0.0
    for s in range(1, stages + 1):
        for k in range(s, k_layers + 1):
            best, best_i = inf, s
            for i in range(s, k + 1):  # last stage is layers i..k
                v = max(f[s - 1][i - 1], prefix[k] - prefix[i - 1])
                if v < best:
                    best, best_i = v, i
            f[s][k], arg[s][k] = best, best_i
    cuts: list[tuple[int, int]] = []
    k = k_layers
    for s in range(stages, 0, -1):
        i = arg[s][k]
        cuts.append((i, k))
        k = i - 1
    cuts.reverse()
    return f[stages][k_layers], cuts
