"""Fluid's tunables (spec Part 3.2): c, d, ε and the three mechanism switches."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FluidConfig:
    """c = max trials per GPU, d = max GPUs per trial, ε = reconfiguration cost in seconds.

    The switches turn off intra-GPU packing (c → 1), inter-GPU spreading (d → 1) and DynamicFluid
    re-planning separately, as Fluid's microbenchmarks do (dissertation §3.6.3-3.6.4).
    """

    max_pack: int = 2
    max_workers: int = 4
    epsilon: float = 0.0
    intra_gpu: bool = True
    inter_gpu: bool = True
    dynamic: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_pack, int) or self.max_pack < 1:
            raise ValueError(f"max_pack (c) must be an integer >= 1, got {self.max_pack!r}")
        if not isinstance(self.max_workers, int) or self.max_workers < 1:
            raise ValueError(f"max_workers (d) must be an integer >= 1, got {self.max_workers!r}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon (scaling overhead, s) must be >= 0, got {self.epsilon}")

    @property
    def c(self) -> int:
        return self.max_pack if self.intra_gpu else 1

    @property
    def d(self) -> int:
        return self.max_workers if self.inter_gpu else 1
