"""The GPU backend over NVML (nvidia-ml-py, module `pynvml`); calls as the NVML API reference documents them.

Health follows NVIDIA's device plugin: critical XID events mark a GPU unhealthy, except XIDs that an
application causes (13, 31, 43, 45, 68, 109), which say nothing about the device.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pynvml

from tessera_agent.gpus import pci
from tessera_agent.gpus.backend import ComputeMode, GpuBackend, GpuDevice, GpuProcess, GpuUsage, HealthEvent

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class NvmlUnavailableError(RuntimeError):
    """NVML could not be loaded or initialised (no driver, no GPU)."""


class NvmlGpuBackend(GpuBackend):
    def __init__(self, *, ignored_xids: frozenset[int] = APPLICATION_XIDS) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailableError(
                f"cannot initialise NVML ({err}); is the NVIDIA driver installed and the GPU visible to this "
                "container (NVIDIA_VISIBLE_DEVICES=all, privileged)?"
            ) from err
        self._ignored_xids = ignored_xids
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._unhealthy: dict[str, str] = {}
        self._last_sample_us: dict[str, int] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            self._handles[_str(pynvml.nvmlDeviceGetUUID(handle))] = handle
        self._events: Any = None
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for handle in self._handles.values():
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
        except pynvml.NVMLError as err:  # e.g. NotSupported inside some VMs: health stays as polled
            log.warning("NVML XID events unavailable (%s); health changes will not be detected", err)
            self._events = None

    def gpus(self) -> list[GpuDevice]:
        out = []
        for uuid, handle in self._handles.items():
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                reserved = int(mem.reserved)
            except pynvml.NVMLError:  # older drivers: v1 has no reserved field
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                reserved = 0
            bus_id = _bus_id(handle)
            out.append(
                GpuDevice(
                    index=int(pynvml.nvmlDeviceGetIndex(handle)),
                    uuid=uuid,
                    model=_str(pynvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=int(mem.total),
                    memory_reserved_bytes=reserved,
                    healthy=uuid not in self._unhealthy,
                    compute_capability=_compute_capability(handle),
                    mig=_mig_enabled(handle),
                    minor=_minor(handle),
                    pci_bus_id=bus_id,
                    pcie_root=pci.pcie_root(bus_id) if bus_id else None,
                    numa_node=pci.numa_node(bus_id) if bus_id else None,
                )
            )
        return sorted(out, key=lambda g: g.index)

    def usage(self, uuid: str) -> GpuUsage:
        handle = self._handle(uuid)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return GpuUsage(memory_used_bytes=int(mem.used), utilization_percent=float(util.gpu))

    def processes(self, uuid: str) -> list[GpuProcess]:
        handle = self._handle(uuid)
        procs: dict[int, GpuProcess] = {}
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            procs[p.pid] = GpuProcess(pid=p.pid, used_memory_bytes=_bytes(p.usedGpuMemory))
        try:
            for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle):
                procs[p.pid] = GpuProcess(pid=p.pid, used_memory_bytes=_bytes(p.usedGpuMemory), mps=True)
        except pynvml.NVMLError_NotSupported:
            pass
        sm = self._sm_util(uuid, handle)
        return [
            GpuProcess(
                pid=p.pid,
                used_memory_bytes=p.used_memory_bytes,
                sm_util_percent=sm.get(p.pid, 0.0),
                mps=p.mps,
            )
            for p in procs.values()
        ]

    def _sm_util(self, uuid: str, handle: Any) -> dict[int, float]:
        """Per-PID SM utilisation from the samples NVML buffered since the previous call."""
        since = self._last_sample_us.get(uuid, 0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NotSupported):
            return {}
        out: dict[int, float] = {}
        for s in samples:
            out[s.pid] = max(out.get(s.pid, 0.0), float(s.smUtil))
            since = max(since, int(s.timeStamp))
        self._last_sample_us[uuid] = since
        return out

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        if self._events is None:
            time.sleep(timeout_s)
            return None
        try:
            data = pynvml.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except pynvml.NVMLError_Timeout:
            return None
        xid = int(data.eventData)
        uuid = _str(pynvml.nvmlDeviceGetUUID(data.device))
        if xid in self._ignored_xids:
            log.info("GPU %s: XID %d is an application error; device stays healthy", uuid, xid)
            return None
        reason = f"critical XID {xid}"
        with self._lock:
            self._unhealthy[uuid] = reason
        return HealthEvent(uuid=uuid, healthy=False, reason=reason)

    def close(self) -> None:
        if self._events is not None:
            pynvml.nvmlEventSetFree(self._events)
            self._events = None
        pynvml.nvmlShutdown()

    def compute_mode(self, uuid: str) -> ComputeMode:
        return _MODES[int(pynvml.nvmlDeviceGetComputeMode(self._handle(uuid)))]

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        pynvml.nvmlDeviceSetComputeMode(self._handle(uuid), _MODES.index(mode))

    def _handle(self, uuid: str) -> Any:
        try:
            return self._handles[uuid]
        except KeyError:
            raise KeyError(f"NVML knows no GPU {uuid!r} (have {sorted(self._handles)})") from None


# NVML_COMPUTEMODE_DEFAULT 0, _EXCLUSIVE_THREAD 1 (deprecated, not used), _PROHIBITED 2, _EXCLUSIVE_PROCESS 3
_MODES: list[ComputeMode] = ["Default", "Default", "Prohibited", "ExclusiveProcess"]


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: int | None) -> int | None:
    return None if value is None else int(value)


def _compute_capability(handle: Any) -> str:
    """`major.minor` as CUDA names it ("8.0" for an A100); "" where NVML cannot tell."""
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except pynvml.NVMLError:
        return ""
    return f"{major}.{minor}"


def _bus_id(handle: Any) -> str:
    """NVML's PCI address of the GPU (`00000000:3B:00.0`); "" where NVML cannot say (or says no address)."""
    try:
        bus_id = _str(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        pci.sysfs_address(bus_id)
    except (pynvml.NVMLError, ValueError):
        return ""
    return bus_id


def _minor(handle: Any) -> int | None:
    """The N of the GPU's /dev/nvidiaN, which the container is given (None where NVML cannot say)."""
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError:
        return None


def _mig_enabled(handle: Any) -> bool:
    """Whether MIG mode is on now; False on GPUs without MIG (NotSupported)."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)
