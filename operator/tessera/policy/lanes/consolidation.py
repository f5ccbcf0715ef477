"""How many GPUs a set of jobs needs: lanes vs exclusive GPUs vs an equal-split MPS plugin (Salus §2.5.2–2.5.3).

- Lanes: first-fit over GPUs, each admitting with Algorithm 2.1 (persistent memory resident, ephemeral
  lanes shared; Salus §2.5.3). Algorithm 2.1 opens a new lane whenever one fits, so in arrival order small
  early jobs can take lanes that later jobs cannot join or grow (the authors call the strategy
  non-optimal, §2.3.3); `LaneConfig.max_lanes` bounds that, and `order="largest_first"` is offered too.
- Exclusive: one GPU per job.
- Equal-split MPS (NVIDIA k8s-device-plugin `replicas` in its sharing config): every GPU is cut into R equal
  slices, R the same for all GPUs; each job needs a slice holding its P + E plus its own CUDA context (each
  MPS client is a separate process). R = ⌊C / largest need⌋.
"""

from __future__ import annotations

import math
from typing import Literal

from tessera.policy.lanes.model import GpuLanes, LaneConfig, LaneJob, LaneModelError


def gpus_with_lanes(
    jobs: list[LaneJob],
    capacity: float,
    config: LaneConfig | None = None,
    *,
    order: Literal["arrival", "largest_first"] = "arrival",
) -> list[GpuLanes]:
    if order not in ("arrival", "largest_first"):
        raise LaneModelError(f"order must be 'arrival' or 'largest_first', got {order!r}")
    if order == "largest_first":
        jobs = sorted(jobs, key=lambda j: (-j.ephemeral, -j.persistent))
    gpus: list[GpuLanes] = []
    for job in jobs:
        if job.persistent + job.ephemeral > capacity:
            raise LaneModelError(f"job {job.job_id!r} does not fit on an empty GPU of {capacity}")
        if not any(g.admit(job) is not None for g in gpus):
            gpus.append(GpuLanes(capacity, config))
            gpus[-1].admit(job)
    return gpus


def gpus_exclusive(jobs: list[LaneJob]) -> int:
    return len(jobs)


def gpus_equal_split(jobs: list[LaneJob], capacity: float, context_overhead: float) -> int:
    need = max(j.persistent + j.ephemeral + context_overhead for j in jobs)
    if need > capacity:
        raise LaneModelError(f"the largest job needs {need}, more than a whole GPU ({capacity})")
    replicas = math.floor(capacity / need)
    return math.ceil(len(jobs) / replicas)
