"""When lanes' dmem limits are written, and what happens when one cannot be (docs/node-agent.md, "GPU memory
through dmem").

A lane's limit must be on its pod's cgroup before the workload's first allocation:

- device-plugin mode: the kubelet's PreStartContainer (asked for with `pre_start_required`), called once the
  pod's cgroup and sandbox exist and before each container using the lane's slots starts;
- DRA mode: NodePrepareResources, which the kubelet calls from its runtime's SyncPod after it made the pod's
  cgroup (pkg/kubelet/kubelet.go SyncPod: pcm.EnsureExists, then containerRuntime.SyncPod, which prepares
  the pod's claims before creating its sandbox). A pod that shares an already prepared claim is not
  prepared again: its limit is written by the agent's periodic round, up to one round after it starts.

Every round (and after a restart) the limits of every pod holding a lane are written again where they
differ, and those of pods whose lanes went are released. A limit that cannot be written is never dropped
silently: a Warning event on the pod, a log line and `tessera_agent_dmem_failures_total`; with
`--dmem required` the container's start (or the claim's prepare) fails too, and the kubelet retries it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tessera_agent.enforce.cgroups import pod_cgroup
from tessera_agent.enforce.dmem import DmemError, DmemLimits, PodMemory
from tessera_agent.lanes.interference import EventSink
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod

log = logging.getLogger(__name__)

EVENT_REASON = "LaneMemoryLimitNotSet"


@dataclass(frozen=True)
class PodRef:
    uid: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pods_memory(lanes: Iterable[tuple[Mapping[str, int], Sequence[str]]]) -> dict[str, PodMemory]:
    """Each pod's memory from the lanes it holds, given as (memory MiB per GPU UUID, the lane's pod UIDs):
    a pod holding several lanes on a GPU is held to their sum; only a lane of one pod is guaranteed."""
    hard: dict[str, dict[str, int]] = {}
    soft: dict[str, dict[str, int]] = {}
    for memory, pod_uids in lanes:
        for uid in pod_uids:
            mine = hard.setdefault(uid, {})
            guaranteed = soft.setdefault(uid, {})
            for gpu, mib in memory.items():
                mine[gpu] = mine.get(gpu, 0) + mib
                if len(pod_uids) == 1:
                    guaranteed[gpu] = guaranteed.get(gpu, 0) + mib
    return {uid: PodMemory(hard[uid], soft[uid]) for uid in hard}


def assigned_lanes(pods: Iterable[NodePod]) -> list[tuple[dict[str, int], list[str]]]:
    """Device-plugin mode: each allocated pod still running holds its assignment's lane."""
    return [
        ({u: p.assignment.memory_mib for u in p.assignment.gpu_uuids}, [p.uid])
        for p in pods
        if p.assignment is not None and p.allocated and not p.finished
    ]


@dataclass
class DmemLanes:
    limits: DmemLimits
    node: str
    required: bool = False
    metrics: AgentMetrics | None = None
    events: EventSink | None = None
    gpu_index: dict[str, int] = field(default_factory=dict)  # UUID → index, the metrics' `gpu` label
    _labels: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)  # pod UID → gauge label sets
    _warned: set[str] = field(default_factory=set)  # pods told of a failure, until a write succeeds
    _applied_at: dict[str, float] = field(default_factory=dict)  # pod UID → clock() of its last write
    clock: Callable[[], float] = time.monotonic

    async def apply(self, pod: PodRef, memory: PodMemory, *, when: str) -> bool:
        """Write the pod's limits now (`when`: what the kubelet is doing, for the messages). False when they
        could not be written (reported); DmemError as well with `required`."""
        try:
            cg = self.limits.apply(pod.uid, memory)
        except DmemError as err:
            await self._failed(pod, f"{when}: {err}")
            if self.required:
                raise
            return False
        self._warned.discard(pod.uid)
        self._applied_at[pod.uid] = self.clock()
        self._gauge(pod, memory)
        log.info(
            "pod %s: dmem.max %s on %s (%s)",
            pod.key,
            ", ".join(f"{g} {mib} MiB" for g, mib in memory.max_mib.items()),
            cg,
            when,
        )
        return True

    async def sync(
        self, wanted: Mapping[str, PodMemory], refs: Mapping[str, PodRef], listed_at: float | None = None
    ) -> None:
        """Every pod in `wanted` (by UID) held to its memory where its cgroup exists; every other pod limited
        before released, unless written after `listed_at` (clock() when the pods behind `wanted` were listed:
        a pod just served may be missing from that listing). A pod whose cgroup is not there yet is left to
        a later round."""
        for uid in sorted(set(self.limits.pods) - set(wanted)):
            if listed_at is not None and self._applied_at.get(uid, float("-inf")) > listed_at:
                continue
            try:
                self.limits.release(uid)
            except DmemError as err:
                self.count_failure()
                log.warning("pod %s: dmem protection not released: %s", uid, err)
                continue
            self._forget_gauge(uid)
            self._applied_at.pop(uid, None)
            self._warned.discard(uid)
        for uid, memory in wanted.items():
            if pod_cgroup(self.limits.node.root, uid) is None:
                continue
            ref = refs.get(uid, PodRef(uid, "", uid))
            await self.apply(ref, memory, when="periodic round")
        try:
            self.limits.settle_all()
        except DmemError as err:
            self.count_failure()
            log.warning("dmem protection of kubelet's cgroups not settled: %s", err)

    async def _failed(self, pod: PodRef, reason: str) -> None:
        self.count_failure()
        message = (
            f"GPU memory limit (cgroup dmem) not written on the pod's cgroup; the lane's memory is held by its "
            f"MPS daemon only: {reason}"
        )
        if pod.uid in self._warned:  # said once until a write succeeds; the failures go on being counted
            log.debug("pod %s: %s", pod.key, message)
            return
        self._warned.add(pod.uid)
        log.warning("pod %s: %s", pod.key, message)
        if self.events is not None and pod.namespace:
            await self.events.event(pod.key, EVENT_REASON, message, warning=True)

    def count_failure(self) -> None:
        if self.metrics is not None:
            self.metrics.counter("tessera_agent_dmem_failures_total").labels(node=self.node).inc()

    def _gauge(self, pod: PodRef, memory: PodMemory) -> None:
        if self.metrics is None:
            return
        self._forget_gauge(pod.uid)
        gauge = self.metrics.gauge("tessera_agent_lane_dmem_bytes")
        labels: list[tuple[str, ...]] = []
        values = [("max", memory.max_mib)] + ([("min", memory.min_mib)] if self.limits.guarantee else [])
        for limit, by_gpu in values:
            for gpu, mib in by_gpu.items():
                key = (self.node, pod.namespace, pod.name, str(self.gpu_index.get(gpu, gpu)), limit)
                gauge.labels(*key).set(mib * 1024 * 1024)
                labels.append(key)
        self._labels[pod.uid] = labels

    def _forget_gauge(self, uid: str) -> None:
        if self.metrics is None:
            return
        gauge = self.metrics.gauge("tessera_agent_lane_dmem_bytes")
        for key in self._labels.pop(uid, []):
            with contextlib.suppress(KeyError):
                gauge.remove(*key)
