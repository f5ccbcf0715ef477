"""The pod's lane assignment, read from the `tessera.io/assignment` annotation written by the extender.

Field names follow the contract (DESIGN.md "Contracts"): node, gpuUUIDs, gpuIndices, laneId, memoryMiB (per
GPU), computePercent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class AssignmentError(ValueError):
    """An assignment annotation that cannot be used, with the reason."""


@dataclass(frozen=True)
class Assignment:
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    lane_id: str
    memory_mib: int
    compute_percent: int

    @classmethod
    def parse(cls, raw: str, *, where: str = "pod") -> Assignment:
        try:
            data: Any = json.loads(raw)
        except json.JSONDecodeError as err:
            raise AssignmentError(f"{where}: tessera.io/assignment is not JSON ({err})") from err
        if not isinstance(data, dict):
            raise AssignmentError(f"{where}: tessera.io/assignment must be a JSON object")
        missing = [k for k in ("node", "gpuUUIDs", "laneId", "memoryMiB", "computePercent") if k not in data]
        if missing:
            raise AssignmentError(f"{where}: tessera.io/assignment lacks {', '.join(missing)}")
        uuids = tuple(str(u) for u in data["gpuUUIDs"])
        indices = tuple(int(i) for i in data.get("gpuIndices", ()))
        if not uuids:
            raise AssignmentError(f"{where}: tessera.io/assignment names no GPU (gpuUUIDs is empty)")
        if indices and len(indices) != len(uuids):
            raise AssignmentError(f"{where}: gpuIndices and gpuUUIDs differ in length")
        memory, compute = int(data["memoryMiB"]), int(data["computePercent"])
        if memory <= 0:
            raise AssignmentError(f"{where}: memoryMiB must be positive, got {memory}")
        if not 1 <= compute <= 100:
            raise AssignmentError(f"{where}: computePercent must be in 1..100, got {compute}")
        return cls(
            node=str(data["node"]),
            gpu_uuids=uuids,
            gpu_indices=indices,
            lane_id=str(data["laneId"]),
            memory_mib=memory,
            compute_percent=compute,
        )
