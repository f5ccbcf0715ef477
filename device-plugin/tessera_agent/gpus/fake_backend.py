"""An in-memory GPU backend for tests and demos: GPUs, processes and injected faults.

It implements `GpuBackend` exactly as the NVML backend does, so code under test cannot tell them apart.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import replace
from typing import Any

from tessera_agent.gpus.backend import (
    MIB,
    ComputeMode,
    GpuBackend,
    GpuDevice,
    GpuProcess,
    GpuUsage,
    HealthEvent,
)


def fake_topology(index: int, gpus_per_root: int) -> dict[str, Any]:
    """GpuDevice's PCI fields for the `index`th GPU of a host with `gpus_per_root` GPUs per root complex:
    root `pci0000:<0x40 * root number>`, the GPU on a bus below it, NUMA node = root number."""
    root, slot = divmod(index, gpus_per_root)
    bus = 0x40 * root
    return {
        "pci_bus_id": f"00000000:{bus + 1 + slot:02X}:00.0",
        "pcie_root": f"pci0000:{bus:02x}",
        "numa_node": root,
    }


class FakeGpuBackend(GpuBackend):
    def __init__(self, gpus: list[GpuDevice]) -> None:
        if len({g.uuid for g in gpus}) != len(gpus):
            raise ValueError("fake GPUs need distinct UUIDs")
        self._lock = threading.Lock()
        self._gpus = {g.uuid: g for g in gpus}
        self._procs: dict[str, dict[int, GpuProcess]] = {g.uuid: {} for g in gpus}
        self._util: dict[str, float] = {g.uuid: 0.0 for g in gpus}
        self._events: queue.Queue[HealthEvent] = queue.Queue()
        self._modes: dict[str, ComputeMode] = {g.uuid: "Default" for g in gpus}  # NVML's compute mode

    @classmethod
    def uniform(
        cls,
        count: int,
        *,
        model: str = "NVIDIA A100-SXM4-40GB",
        memory_mib: int = 40960,
        reserved_mib: int = 512,
        compute_capability: str = "8.0",
        gpus_per_root: int = 2,
    ) -> FakeGpuBackend:
        """`count` alike GPUs, `gpus_per_root` of them under each PCIe root complex (one NUMA node per root),
        as NVML and sysfs would report a host of several root ports."""
        return cls(
            [
                GpuDevice(
                    index=i,
                    uuid=f"GPU-00000000-0000-0000-0000-{i:012d}",
                    model=model,
                    memory_total_bytes=memory_mib * MIB,
                    memory_reserved_bytes=reserved_mib * MIB,
                    compute_capability=compute_capability,
                    minor=i,
                    **fake_topology(i, gpus_per_root),
                )
                for i in range(count)
            ]
        )

    # --- ComputeModeControl ---
    def compute_mode(self, uuid: str) -> ComputeMode:
        self._require(uuid)
        with self._lock:
            return self._modes[uuid]

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        self._require(uuid)
        with self._lock:
            self._modes[uuid] = mode

    # --- GpuBackend ---
    def gpus(self) -> list[GpuDevice]:
        with self._lock:
            return sorted(self._gpus.values(), key=lambda g: g.index)

    def usage(self, uuid: str) -> GpuUsage:
        with self._lock:
            self._require(uuid)
            used = sum(p.used_memory_bytes or 0 for p in self._procs[uuid].values())
            return GpuUsage(memory_used_bytes=used, utilization_percent=self._util[uuid])

    def processes(self, uuid: str) -> list[GpuProcess]:
        with self._lock:
            self._require(uuid)
            return list(self._procs[uuid].values())

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        pass

    # --- test controls ---
    def add_process(
        self, uuid: str, pid: int, used_mib: float | None, *, sm_util: float = 0.0, mps: bool = True
    ) -> None:
        used = None if used_mib is None else int(used_mib * MIB)
        with self._lock:
            self._require(uuid)
            self._procs[uuid][pid] = GpuProcess(
                pid=pid, used_memory_bytes=used, sm_util_percent=sm_util, mps=mps
            )

    def remove_process(self, uuid: str, pid: int) -> None:
        with self._lock:
            self._procs[uuid].pop(pid, None)

    def set_utilization(self, uuid: str, percent: float) -> None:
        with self._lock:
            self._require(uuid)
            self._util[uuid] = percent

    def inject_fault(self, uuid: str, reason: str = "XID 79: GPU has fallen off the bus") -> None:
        """Mark a GPU unhealthy and deliver the event, as an NVML XID critical error would."""
        self._set_health(uuid, False, reason)

    def recover(self, uuid: str, reason: str = "recovered") -> None:
        self._set_health(uuid, True, reason)

    def _set_health(self, uuid: str, healthy: bool, reason: str) -> None:
        with self._lock:
            self._require(uuid)
            self._gpus[uuid] = replace(self._gpus[uuid], healthy=healthy)
        self._events.put(HealthEvent(uuid=uuid, healthy=healthy, reason=reason))

    def _require(self, uuid: str) -> None:
        if uuid not in self._gpus:
            raise KeyError(f"no GPU with UUID {uuid!r} on this fake node (have {sorted(self._gpus)})")
