"""A placement: disjoint device groups, a parallel config per group, and the models on each group.

Exactly the paper's "placement" (AlpaServe §4.2). Memory feasibility, per Algorithm 1: with
config (pp, op) stage k of every model in a group lives on the same devices, so per stage
Σ_m stage_weight[m][k] ≤ budget ("per_stage", exact) or the authors' code's conservative Σ_m max_k ≤ budget ("max_stage").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from tessera.policy.serving.alpaserve.profiles import ModelProfile, ParallelConfig

MemoryRule = Literal["per_stage", "max_stage"]
GB = 1e9  # Table 1 sizes are decimal GB
GIB = float(1 << 30)  # the authors' code budgets in GiB (Table 1 sizes are decimal GB)


class ModelPlacementError(ValueError):
    """A placement that breaks an invariant (overlapping devices, memory, duplicate models...)."""


@dataclass(frozen=True)
class Group:
    devices: tuple[int, ...]
    config: ParallelConfig
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.devices) != self.config.size:
            raise ModelPlacementError(
                f"group on devices {self.devices} has {len(self.devices)} devices but config "
                f"{self.config} needs pp·op = {self.config.size}"
            )
        if len(set(self.models)) != len(self.models):
            raise ModelPlacementError(f"group on devices {self.devices} holds a model twice: {self.models}")

    def stage_devices(self, k: int) -> tuple[int, ...]:
        """Devices of pipeline stage k: consecutive blocks of ``op`` devices."""
        op = self.config.op
        return self.devices[k * op : (k + 1) * op]

    def with_model(self, model: str) -> Group:
        return replace(self, models=(*self.models, model))


@dataclass(frozen=True)
class ModelPlacement:
    groups: tuple[Group, ...]

    @classmethod
    def empty(cls, configs: Sequence[ParallelConfig], first_device: int = 0) -> ModelPlacement:
        """Empty groups with the given configs on consecutive devices starting at ``first_device``."""
        groups, d = [], first_device
        for cfg in configs:
            groups.append(Group(tuple(range(d, d + cfg.size)), cfg))
            d += cfg.size
        return cls(tuple(groups))

    @property
    def num_devices(self) -> int:
        return sum(len(g.devices) for g in self.groups)

    def with_model(self, group_index: int, model: str) -> ModelPlacement:
        gs = list(self.groups)
        gs[group_index] = gs[group_index].with_model(model)
        return ModelPlacement(tuple(gs))

    def replicas(self, model: str) -> int:
        return sum(model in g.models for g in self.groups)

    def num_replicas(self) -> int:
        return sum(len(g.models) for g in self.groups)

    def key(self) -> tuple[tuple[tuple[int, ...], ParallelConfig, tuple[str, ...]], ...]:
        """Normalised form for de-duplication: models sorted within each group."""
        return tuple((g.devices, g.config, tuple(sorted(g.models))) for g in self.groups)

    def describe(self) -> str:
        return "; ".join(f"{g.config}@{list(g.devices)}:{','.join(g.models) or '-'}" for g in self.groups)


def stage_memory(
    group: Group, profiles: Mapping[str, ModelProfile], rule: MemoryRule = "per_stage"
) -> list[float]:
    """Per-device weight bytes of each stage of ``group`` under ``rule``."""
    pp = group.config.pp
    totals = [0.0] * pp
    for m in group.models:
        w = profiles[m].stages(group.config).stage_weight_bytes
        if rule == "per_stage":
            for k in range(pp):
                totals[k] += w[k]
        elif rule == "max_stage":
            peak = max(w)
            for k in range(pp):
                totals[k] += peak
        else:
            raise ValueError(f"unknown memory rule {rule!r}; use 'per_stage' or 'max_stage'")
    return totals


def fits(
    group: Group,
    model: str,
    profiles: Mapping[str, ModelProfile],
    budget_bytes: float,
    rule: MemoryRule = "per_stage",
) -> bool:
    """Could ``model`` join ``group`` under the per-device budget? False if it has no such config."""
    prof = profiles[model]
    if model in group.models or not prof.supports(group.config):
        return False
    cur = stage_memory(group, profiles, rule)
    w = prof.stages(group.config).stage_weight_bytes
    add = list(w) if rule == "per_stage" else [max(w)] * len(w)
    return all(c + a <= budget_bytes * (1 + 1e-12) for c, a in zip(cur, add, strict=True))


def validate(
    placement: ModelPlacement,
    profiles: Mapping[str, ModelProfile],
    budget_bytes: float,
    *,
    num_devices: int | None = None,
    rule: MemoryRule = "per_stage",
) -> None:
    """Raise ModelPlacementError unless every group's devices are disjoint, its models have a profile for its
    parallel config and fit the per-device memory budget (AlpaServe §4.2), and the cluster size matches."""
    seen: set[int] = set()
    for g in placement.groups:
        overlap = seen.intersection(g.devices)
        if overlap:
            raise ModelPlacementError(f"devices {sorted(overlap)} belong to more than one group")
        seen.update(g.devices)
        for m in g.models:
            if m not in profiles:
                raise ModelPlacementError(f"group {list(g.devices)} holds unknown model {m!r}")
            if not profiles[m].supports(g.config):
                raise ModelPlacementError(f"model {m!r} has no profile for config {g.config}")
        mem = stage_memory(g, profiles, rule)
        if max(mem, default=0.0) > budget_bytes * (1 + 1e-12):
            raise ModelPlacementError(
                f"group {list(g.devices)} {g.config} needs {max(mem) / GB:.2f} GB per device, "
                f"over the {budget_bytes / GB:.2f} GB budget"
            )
    if num_devices is not None and placement.num_devices != num_devices:
        raise ModelPlacementError(
            f"placement uses {placement.num_devices} devices, cluster has {num_devices}"
        )
