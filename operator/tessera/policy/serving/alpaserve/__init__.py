"""AlpaServe (OSDI'23): model-parallel placement for statistical multiplexing (Li et al., OSDI'23).

Profiles per parallel config → Algorithm 2 (buckets, group partitions, configs) → Algorithm 1 or the fast
heuristic, scored by the placement simulator → a ModelPlacement served by shortest-queue dispatch.
"""

from tessera.policy.serving.alpaserve.dispatch import NO_REPLICA, ShortestQueueDispatcher
from tessera.policy.serving.alpaserve.greedy import (
    Scored,
    evaluate,
    fast_greedy_selection,
    greedy_selection,
)
from tessera.policy.serving.alpaserve.placement import (
    GB,
    GIB,
    Group,
    MemoryRule,
    ModelPlacement,
    ModelPlacementError,
    fits,
    stage_memory,
    validate,
)
from tessera.policy.serving.alpaserve.profiles import (
    ModelProfile,
    ParallelConfig,
    StageProfile,
    all_configs,
    partition_stages,
    synthetic_profile,
    synthetic_stage_profile,
)
from tessera.policy.serving.alpaserve.search import (
    SearchOptions,
    SearchResult,
    bucket_models,
    device_partitions,
    group_configs,
    place,
    place_bucket,
    prune_device_partitions,
)
from tessera.policy.serving.alpaserve.simulator import SimStats, simulate, simulate_reference
from tessera.policy.serving.alpaserve.workload import Workload

__all__ = [
    "GB",
    "GIB",
    "NO_REPLICA",
    "Group",
    "MemoryRule",
    "ModelPlacement",
    "ModelPlacementError",
    "ModelProfile",
    "ParallelConfig",
    "Scored",
    "SearchOptions",
    "SearchResult",
    "ShortestQueueDispatcher",
    "SimStats",
    "StageProfile",
    "Workload",
    "all_configs",
    "bucket_models",
    "device_partitions",
    "evaluate",
    "fast_greedy_selection",
    "fits",
    "greedy_selection",
    "group_configs",
    "partition_stages",
    "place",
    "place_bucket",
    "prune_device_partitions",
    "simulate",
    "simulate_reference",
    "stage_memory",
    "synthetic_profile",
    "synthetic_stage_profile",
    "validate",
]
