"""HP and BE lanes on a shared GPU (Orion's single high-priority client beside best-effort ones).

A lane is high-priority (HP) when its pod's `tessera.io/workload` class is `latency-critical`, or, without a
class there, when its `priorityClassName` is one of `hp_priority_classes`; otherwise best-effort (BE). The
agent applies what MPS offers, read by each client when its CUDA context starts:
- HP: all active threads (100%), `CUDA_MPS_CLIENT_PRIORITY=0`, its pinned-memory limit;
- BE: the GPU's current BE percentage `p_be` (never more than the lane's assigned compute), priority 1,
  its pinned-memory limit.
Admission enforces Orion's assumption that collocated jobs fit in GPU memory together (Orion §5.1.3): on each GPU
the lanes' memory never adds up past the GPU's memory less its reserve, and at most one HP lane per GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from tessera.api import contract

from tessera_agent.pods import NodePod

LaneClass = Literal["HP", "BE"]
PRIORITY_HP = 0  # CUDA_MPS_CLIENT_PRIORITY: normal
PRIORITY_BE = 1  # below normal
DEFAULT_BE_PERCENT = 50


class LaneAdmissionError(RuntimeError):
    """A lane that cannot be admitted on its GPU; the message is what kubelet shows on the pod."""


def lane_class(
    pod: NodePod, hp_priority_classes: Iterable[str] = (contract.CLASS_LATENCY_CRITICAL,)
) -> LaneClass:
    """HP or BE from the workload annotation's class, else from the pod's priority class."""
    if ":" in pod.workload:
        klass = pod.workload.split(":", 1)[1].strip()
        if klass == contract.CLASS_LATENCY_CRITICAL:
            return "HP"
        if klass == contract.CLASS_BEST_EFFORT:
            return "BE"
        raise LaneAdmissionError(
            f"pod {pod.key}: {contract.ANN_WORKLOAD} class must be {contract.CLASS_LATENCY_CRITICAL} or "
            f"{contract.CLASS_BEST_EFFORT}, got {klass!r}"
        )
    return "HP" if pod.priority_class in set(hp_priority_classes) else "BE"


@dataclass(frozen=True)
class PodLane:
    uid: str
    pod: str  # namespace/name
    gpu: str  # UUID
    klass: LaneClass
    memory_mib: int
    compute_percent: int  # assigned by the extender
    checkpoints: bool
    p99_dedicated_s: float | None = None  # the pod's tessera.io/p99-dedicated-seconds (HP lanes)
    # DRA: a pod running in a claim's lane (the book keys that lane by the claim's UID; `uid` is then the pod's)
    claim: str | None = None


@dataclass
class LaneBook:
    """The lanes on this node's GPUs, for admission and for the BE feedback loop.

    `usable_mib`: per GPU UUID, its memory less the driver reserve and the agent's extra reserve.
    """

    usable_mib: Mapping[str, int]
    hp_priority_classes: tuple[str, ...] = (contract.CLASS_LATENCY_CRITICAL,)
    default_be_percent: int = DEFAULT_BE_PERCENT
    lanes: dict[tuple[str, str], PodLane] = field(default_factory=dict)  # (uid, gpu) → lane
    be_percent: dict[str, int] = field(default_factory=dict)  # per GPU; default_be_percent when unset

    def __post_init__(self) -> None:
        if not 1 <= self.default_be_percent <= 100:
            raise ValueError(f"BE percentage must be in 1..100, got {self.default_be_percent}")

    def on_gpu(self, gpu: str) -> list[PodLane]:
        return [ln for ln in self.lanes.values() if ln.gpu == gpu]

    def hp_lane(self, gpu: str) -> PodLane | None:
        return next((ln for ln in self.on_gpu(gpu) if ln.klass == "HP"), None)

    def be_percent_of(self, gpu: str) -> int:
        return self.be_percent.get(gpu, self.default_be_percent)

    def set_be_percent(self, gpu: str, percent: int) -> None:
        if not 1 <= percent <= 100:
            raise ValueError(f"BE percentage must be in 1..100, got {percent}")
        self.be_percent[gpu] = percent

    def admit(self, pod: NodePod) -> list[PodLane]:
        """Record the pod's lane on each of its GPUs, or refuse it with the reason (nothing recorded)."""
        a = pod.assignment
        if a is None:
            raise LaneAdmissionError(f"pod {pod.key} has no {contract.ANN_ASSIGNMENT} annotation")
        klass = lane_class(pod, self.hp_priority_classes)
        return self.admit_lane(
            pod.uid,
            pod.key,
            {g: a.memory_mib for g in a.gpu_uuids},
            klass,
            a.compute_percent,
            checkpoints=pod.checkpoints,
            p99_dedicated_s=pod.p99_dedicated_s,
        )

    def admit_lane(
        self,
        uid: str,
        name: str,
        memory_mib: Mapping[str, int],
        klass: LaneClass,
        compute_percent: int,
        *,
        checkpoints: bool = False,
        p99_dedicated_s: float | None = None,
    ) -> list[PodLane]:
        """Record a lane (a pod's, or a DRA claim's keyed by its UID) on each GPU of `memory_mib` (UUID →
        MiB), or refuse it with the reason: a second HP lane on a GPU, or lanes' memory past what it has."""
        new = []
        for gpu, mib in memory_mib.items():
            if gpu not in self.usable_mib:
                raise LaneAdmissionError(f"pod {name}: GPU {gpu} is not on this node")
            others = [ln for ln in self.on_gpu(gpu) if ln.uid != uid]
            if klass == "HP" and any(ln.klass == "HP" for ln in others):
                hp = next(ln for ln in others if ln.klass == "HP")
                raise LaneAdmissionError(
                    f"pod {name}: GPU {gpu} already has a high-priority lane ({hp.pod}); at most one per GPU"
                )
            used = sum(ln.memory_mib for ln in others)
            if used + mib > self.usable_mib[gpu]:
                raise LaneAdmissionError(
                    f"pod {name}: {mib} MiB on GPU {gpu} would bring its lanes to "
                    f"{used + mib} MiB, over the {self.usable_mib[gpu]} MiB usable (memory less reserve)"
                )
            new.append(PodLane(uid, name, gpu, klass, mib, compute_percent, checkpoints, p99_dedicated_s))
        for ln in new:
            self.lanes[(ln.uid, ln.gpu)] = ln
        return new

    def forget(self, uid: str) -> None:
        """Drop a lane (a claim unprepared)."""
        for key in [k for k, ln in self.lanes.items() if ln.uid == uid]:
            del self.lanes[key]

    def class_limits(self, klass: LaneClass, compute_percent: int, gpus: Iterable[str]) -> tuple[int, int]:
        """(active-thread percentage, MPS client priority) of a lane of `klass`: HP all threads at normal
        priority; BE its assigned share capped by the GPUs' current BE percentage, below normal."""
        if klass == "HP":
            return 100, PRIORITY_HP
        return min([compute_percent, *(self.be_percent_of(g) for g in gpus)]), PRIORITY_BE

    def sync(self, live_uids: Iterable[str]) -> list[PodLane]:
        """Forget lanes of pods no longer on the node; returns what was dropped."""
        live = set(live_uids)
        gone = [k for k, ln in self.lanes.items() if ln.uid not in live]
        return [self.lanes.pop(k) for k in gone]

    def refresh(self, pods: Iterable[NodePod]) -> list[str]:
        """Match the book to the node's pods: drop lanes of pods gone or finished (Succeeded/Failed: the
        object stays until deleted, the GPU work does not), and record lanes of pods allocated before the
        agent (re)started. Returns why any allocated pod could not be recorded."""
        pods = [p for p in pods if not p.finished]
        self.sync(p.uid for p in pods)
        known = {ln.uid for ln in self.lanes.values()}
        problems = []
        for p in pods:
            if p.allocated and p.assignment is not None and p.uid not in known:
                try:
                    self.admit(p)
                except LaneAdmissionError as err:
                    problems.append(str(err))
        return problems

    def env(self, pod: NodePod) -> dict[str, str]:
        """The MPS env of the pod's lane class (on top of the lane env Allocate already builds)."""
        a = pod.assignment
        if a is None:
            raise LaneAdmissionError(f"pod {pod.key} has no {contract.ANN_ASSIGNMENT} annotation")
        pct, priority = self.class_limits(
            lane_class(pod, self.hp_priority_classes), a.compute_percent, a.gpu_uuids
        )
        return {
            contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE: str(pct),
            contract.ENV_MPS_CLIENT_PRIORITY: str(priority),
        }
