"""Per-lane telemetry: attribute NVML's per-process memory and SM samples to pods and lanes.

NVML reports host PIDs; a PID belongs to the pod whose UID appears in its cgroup path (needs hostPID).
A pod holds a lane: in device-plugin mode its assignment names the lane and its limits; in DRA mode the claim
prepared for it does (`kubelet.dra_plugin.DraServicer.held_lanes`). Memory used is set against the lane's
MPS pinned limit and a lane above it is flagged — the per-pod view DCGM lacks under MPS.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera_agent.gpus.backend import MIB, GpuBackend
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod

log = logging.getLogger(__name__)

# cgroupfs: .../pod1f2e3d4c-..../<container>; systemd: ...-pod1f2e3d4c_...slice/...
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

PidResolver = Callable[[int], "str | None"]


def pod_uid_from_cgroup(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The pod UID in `/proc/<pid>/cgroup`, or None for a process outside any pod (or already gone)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    m = _POD_UID.search(text)
    return m.group(1).replace("_", "-") if m else None


@dataclass(frozen=True)
class HeldLane:
    """A lane a pod holds: its id, and per GPU (UUID) its memory limit (MiB) and compute share (%)."""

    lane: str
    pod_uid: str
    namespace: str
    pod: str
    limits: dict[str, tuple[int, int]]


def lanes_of_pods(pods: Sequence[NodePod]) -> list[HeldLane]:
    """The lanes pods hold through their `tessera.io/assignment` (device-plugin mode)."""
    return [
        HeldLane(
            p.assignment.lane_id,
            p.uid,
            p.namespace,
            p.name,
            dict.fromkeys(p.assignment.gpu_uuids, (p.assignment.memory_mib, p.assignment.compute_percent)),
        )
        for p in pods
        if p.assignment is not None
    ]


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    healthy: bool
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_ratio: float
    unattributed_memory_bytes: int  # processes outside any Tessera lane (e.g. the MPS server itself)


@dataclass(frozen=True)
class LaneSample:
    index: int
    uuid: str
    lane: str
    namespace: str
    pod: str
    memory_used_bytes: int
    memory_limit_bytes: int
    compute_limit_ratio: float
    utilization_ratio: float

    @property
    def over_limit(self) -> bool:
        return self.memory_used_bytes > self.memory_limit_bytes


def collect(
    backend: GpuBackend, held: Sequence[HeldLane], resolve_pid: PidResolver
) -> tuple[list[GpuSample], list[LaneSample]]:
    by_uid = {h.pod_uid: h for h in held}
    gpus: list[GpuSample] = []
    lanes: list[LaneSample] = []
    for gpu in backend.gpus():
        usage = backend.usage(gpu.uuid)
        mem: dict[str, int] = defaultdict(int)
        sm: dict[str, float] = defaultdict(float)
        unattributed = 0
        for proc in backend.processes(gpu.uuid):
            uid = resolve_pid(proc.pid)
            lane = by_uid.get(uid) if uid else None
            if lane is None or gpu.uuid not in lane.limits:
                unattributed += proc.used_memory_bytes or 0
                continue
            mem[lane.pod_uid] += proc.used_memory_bytes or 0
            sm[lane.pod_uid] += proc.sm_util_percent
        gpus.append(
            GpuSample(
                index=gpu.index,
                uuid=gpu.uuid,
                healthy=gpu.healthy,
                memory_used_bytes=usage.memory_used_bytes,
                memory_total_bytes=gpu.memory_total_bytes,
                utilization_ratio=usage.utilization_percent / 100.0,
                unattributed_memory_bytes=unattributed,
            )
        )
        # every lane on this GPU is reported, idle ones with zero use, so dashboards see the limits
        for lane in by_uid.values():
            if gpu.uuid not in lane.limits:
                continue
            memory_mib, compute_percent = lane.limits[gpu.uuid]
            lanes.append(
                LaneSample(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    lane=lane.lane,
                    namespace=lane.namespace,
                    pod=lane.pod,
                    memory_used_bytes=mem.get(lane.pod_uid, 0),
                    memory_limit_bytes=memory_mib * MIB,
                    compute_limit_ratio=compute_percent / 100.0,
                    utilization_ratio=min(1.0, sm.get(lane.pod_uid, 0.0) / 100.0),
                )
            )
    return gpus, lanes


class LaneTelemetry:
    """Samples the backend, exports tessera_gpu_* / tessera_lane_* and logs lanes above their limit."""

    def __init__(
        self,
        node: str,
        backend: GpuBackend,
        metrics: AgentMetrics,
        resolve_pid: PidResolver = pod_uid_from_cgroup,
    ) -> None:
        self.node = node
        self.backend = backend
        self.metrics = metrics
        self.resolve_pid = resolve_pid
        self._flagged: set[tuple[str, str]] = set()

    def update(self, pods: Sequence[NodePod], held: Sequence[HeldLane] | None = None) -> list[LaneSample]:
        """Refresh every gauge from one sample; returns the lanes above their memory limit. The lanes are the
        pods' assignments' unless `held` names them (DRA mode: the prepared claims')."""
        gpus, lanes = collect(self.backend, lanes_of_pods(pods) if held is None else held, self.resolve_pid)
        m = self.metrics
        gpu_gauges = [
            "tessera_gpu_utilization_ratio",
            "tessera_gpu_memory_used_bytes",
            "tessera_gpu_memory_total_bytes",
            "tessera_gpu_healthy",
        ]
        lane_gauges = [
            "tessera_lane_memory_used_bytes",
            "tessera_lane_memory_limit_bytes",
            "tessera_lane_compute_limit_ratio",
            "tessera_lane_utilization_ratio",
            "tessera_lane_over_limit",
        ]
        for name in gpu_gauges + lane_gauges:
            m.gauge(name).clear()  # lanes come and go; stale series must not linger
        for g in gpus:
            labels = {"node": self.node, "gpu": str(g.index), "uuid": g.uuid}
            m.gauge("tessera_gpu_utilization_ratio").labels(**labels).set(g.utilization_ratio)
            m.gauge("tessera_gpu_memory_used_bytes").labels(**labels).set(g.memory_used_bytes)
            m.gauge("tessera_gpu_memory_total_bytes").labels(**labels).set(g.memory_total_bytes)
            m.gauge("tessera_gpu_healthy").labels(**labels).set(1 if g.healthy else 0)
        over = []
        for lane in lanes:
            labels = {
                "node": self.node,
                "gpu": str(lane.index),
                "lane": lane.lane,
                "namespace": lane.namespace,
                "pod": lane.pod,
            }
            m.gauge("tessera_lane_memory_used_bytes").labels(**labels).set(lane.memory_used_bytes)
            m.gauge("tessera_lane_memory_limit_bytes").labels(**labels).set(lane.memory_limit_bytes)
            m.gauge("tessera_lane_compute_limit_ratio").labels(**labels).set(lane.compute_limit_ratio)
            m.gauge("tessera_lane_utilization_ratio").labels(**labels).set(lane.utilization_ratio)
            m.gauge("tessera_lane_over_limit").labels(**labels).set(1 if lane.over_limit else 0)
            key = (lane.uuid, lane.lane)
            if lane.over_limit:
                over.append(lane)
                if key not in self._flagged:
                    log.warning(
                        "lane %s of pod %s/%s on GPU %d uses %d MiB, above its %d MiB limit",
                        lane.lane,
                        lane.namespace,
                        lane.pod,
                        lane.index,
                        lane.memory_used_bytes // MIB,
                        lane.memory_limit_bytes // MIB,
                    )
                self._flagged.add(key)
            else:
                self._flagged.discard(key)
        return over
