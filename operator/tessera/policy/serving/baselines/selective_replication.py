"""Selective Replication (AlpaServe's SR baseline, §6.2).

"AlpaServe's placement algorithm without model parallelism" — Clipper/Nexus-style replication: every
device is its own group with config (1,1), filled by the same simulator-guided selection.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.policy.serving.alpaserve.greedy import Scored, fast_greedy_selection, greedy_selection
from tessera.policy.serving.alpaserve.placement import MemoryRule, ModelPlacement
from tessera.policy.serving.alpaserve.profiles import ModelProfile, ParallelConfig
from tessera.policy.serving.alpaserve.workload import Workload

SINGLE = ParallelConfig(1, 1)


def selective_replication(
    profiles: Sequence[ModelProfile],
    num_devices: int,
    workload: Workload,
    budget_bytes: float,
    *,
    fast_heuristic: bool = True,
    beam_size: int = 1,
    memory_rule: MemoryRule = "per_stage",
    fixed_overhead_s: float = 0.0,
    first_device: int = 0,
) -> Scored:
    """SR placement on ``num_devices`` single-device groups. Models must fit one device (AlpaServe §6.2)."""
    if num_devices < 1:
        raise ValueError(f"need at least one device, got {num_devices}")
    for p in profiles:
        if not p.supports(SINGLE):
            raise ValueError(f"selective replication needs a (1,1) profile for model {p.name!r}")
        if max(p.stages(SINGLE).stage_weight_bytes) > budget_bytes:
            raise ValueError(
                f"model {p.name!r} ({p.weight_bytes / 1e9:.1f} GB) does not fit one device's "
                f"{budget_bytes / 1e9:.1f} GB budget; selective replication cannot serve it"
            )
    by_name = {p.name: p for p in profiles}
    names = [p.name for p in profiles]
    base = ModelPlacement.empty([SINGLE] * num_devices, first_device)
    w = workload.only(names)
    if fast_heuristic:
        return fast_greedy_selection(
            names, base, by_name, w, budget_bytes, memory_rule=memory_rule, fixed_overhead_s=fixed_overhead_s
        )
    return greedy_selection(
        names,
        base,
        by_name,
        w,
        budget_bytes,
        beam_size=beam_size,
        memory_rule=memory_rule,
        fixed_overhead_s=fixed_overhead_s,
    )
