"""The GPU backend interface the agent reads the node's GPUs through (real NVML or a fake).

Everything the agent needs from NVML (NVML API) is behind this small protocol, so the device
plugin, inventory and telemetry are the same code on a GPU node and in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

MIB = 1024 * 1024
ComputeMode = Literal["Default", "ExclusiveProcess", "Prohibited"]  # NVML's NVML_COMPUTEMODE_*
COMPUTE_MODES: tuple[ComputeMode, ...] = ("Default", "ExclusiveProcess", "Prohibited")


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_reserved_bytes: int  # held by the driver/ECC, never available to processes (NVML memory_v2)
    healthy: bool = True
    compute_capability: str = ""  # CUDA's "major.minor"; "" where unknown
    mig: bool = False  # MIG mode on
    minor: int | None = None  # the N of /dev/nvidiaN (NVML's minor number); None where unknown
    pci_bus_id: str = ""  # NVML's PCI address (`00000000:3B:00.0`); "" where unknown
    pcie_root: str | None = None  # the root complex above it (`pci0000:3a`, gpus.pci); None where unknown
    numa_node: int | None = None  # the NUMA node the kernel puts it on; None where unknown


@dataclass(frozen=True)
class GpuUsage:
    """A device-wide sample: memory in use and SM utilisation (0–100)."""

    memory_used_bytes: int
    utilization_percent: float


@dataclass(frozen=True)
class GpuProcess:
    """A process with a compute context on a GPU; `mps` when it runs as an MPS client."""

    pid: int
    used_memory_bytes: int | None  # None where NVML cannot tell (N/A)
    sm_util_percent: float = 0.0
    mps: bool = False


@dataclass(frozen=True)
class HealthEvent:
    """A health change on one GPU, e.g. a critical XID error."""

    uuid: str
    healthy: bool
    reason: str


class GpuBackend(Protocol):
    """Read-only view of the node's GPUs."""

    def gpus(self) -> list[GpuDevice]: ...

    def usage(self, uuid: str) -> GpuUsage: ...

    def processes(self, uuid: str) -> list[GpuProcess]: ...

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to `timeout_s` for the next health change; None when none came."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ComputeModeControl(Protocol):
    """A GPU's compute mode (nvmlDeviceGetComputeMode / nvmlDeviceSetComputeMode, which needs root)."""

    def compute_mode(self, uuid: str) -> ComputeMode: ...

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None: ...


def usable_memory_mib(gpu: GpuDevice, extra_reserve_mib: int = 0) -> int:
    """Memory lanes may be carved from: total minus driver-reserved minus an operator-set margin.

    Not deducting the driver reserve lets lanes overcommit and OOM (kai-scheduler/KAI-Scheduler#2212).
    """
    usable = (gpu.memory_total_bytes - gpu.memory_reserved_bytes) // MIB - extra_reserve_mib
    return max(0, usable)
