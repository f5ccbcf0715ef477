"""The cluster model: GPUs, machines, racks, locality and allocations. Plain data plus invariants."""

from tessera.cluster.allocation import Allocation, AllocationError
from tessera.cluster.topology import (
    COMPUTE_INTENSIVE,
    GPU,
    NETWORK_INTENSIVE,
    Cluster,
    Locality,
    Machine,
    Sensitivity,
)

__all__ = [
    "COMPUTE_INTENSIVE",
    "GPU",
    "NETWORK_INTENSIVE",
    "Allocation",
    "AllocationError",
    "Cluster",
    "Locality",
    "Machine",
    "Sensitivity",
]
