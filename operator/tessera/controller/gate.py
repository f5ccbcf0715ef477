"""Pods that are not Tessera's own waiting in their namespace's queue (docs/queues.md, "Pods and Jobs in a
queue").

The chart's MutatingAdmissionPolicy gives every pod created in a namespace with the queue label that asks for
`tessera.io/gpu` (and is not the operator's) the scheduling gate `tessera.io/queue` and the label
`tessera.io/queued: "true"`. Such a pod is held by kube-scheduler until the gate goes. Here the operator
keeps those pods (from its pod watch), groups them — a Job's pods together, any other pod alone — and
removes the gate from a whole group once its queue has room for all of the group's GPUs. Per queue the
oldest group goes first, but a group that does not fit does not hold back smaller ones behind it (Kueue's
BestEffortFIFO). Gated groups are their queue's waiting demand; admitted pods are its holdings, never
reclaimed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.api import contract
from tessera.api.quantity import QuantityError, pod_totals
from tessera.controller.queue_status import WAITING_FOR_PODS, Workload
from tessera.controller.quotas import Requests, pod_requests, total
from tessera.kube import PODS, Kind, KubeError
from tessera.policy.queues.reclaim import Holding

log = logging.getLogger(__name__)

JOBS = Kind("batch", "v1", "jobs")
_DONE_PHASES = frozenset({"Succeeded", "Failed"})
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class QueuedPod:
    """What admission needs of a pod carrying `tessera.io/queued: "true"`."""

    namespace: str
    name: str
    uid: str
    created: str  # creationTimestamp (RFC 3339 in UTC: its text order is its time order)
    gpus: int  # tessera.io/gpu its containers ask for
    gated: bool  # still carries the queue's scheduling gate
    group: str  # "Job/<name>" for a Job's pods, "Pod/<name>" for a pod alone
    gates: tuple[str, ...] = ()  # every scheduling gate it carries (others' are kept when ours goes)
    resource_version: str = ""
    done: bool = False  # finished or being deleted: holds nothing, waits for nothing
    bound: bool = False  # spec.nodeName set: its GPUs show in the view's (the extender's assignment)
    requests: Requests = field(default_factory=Requests)  # CPU and memory (a queue's maxCPU, maxMemory)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def requested_gpus(spec: Mapping[str, Any]) -> int:
    """The `tessera.io/gpu` the pod's containers ask for (`pod_totals`, as the extender reads it); a pod
    with an unreadable Tessera quantity counts 0 (the extender refuses it with the reason)."""
    try:
        totals = pod_totals(spec)
    except QuantityError:
        return 0
    return 0 if totals is None else totals[contract.RESOURCE_GPU]


def job_of(meta: Mapping[str, Any]) -> str | None:
    """The Job that controls the pod: its controller ownerReference, else the Job controller's label."""
    for ref in meta.get("ownerReferences") or []:
        if (
            ref.get("kind") == "Job"
            and str(ref.get("apiVersion", "")).startswith("batch/")
            and ref.get("controller")
        ):
            return str(ref.get("name"))
    name = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME)
    return str(name) if name else None


def queued_pod(body: Mapping[str, Any]) -> QueuedPod | None:
    """The pod as admission sees it; None for a pod the queue's policy did not mark."""
    meta = body.get("metadata") or {}
    if (meta.get("labels") or {}).get(contract.LABEL_QUEUED) != "true":
        return None
    spec = body.get("spec") or {}
    gates = tuple(str(g.get("name", "")) for g in spec.get("schedulingGates") or [])
    job = job_of(meta)
    name = str(meta.get("name", ""))
    phase = str((body.get("status") or {}).get("phase") or "Pending")
    return QueuedPod(
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=str(meta.get("uid", "")),
        created=str(meta.get("creationTimestamp") or ""),
        gpus=requested_gpus(spec),
        gated=contract.SCHEDULING_GATE_QUEUE in gates,
        group=f"Job/{job}" if job else f"Pod/{name}",
        gates=gates,
        resource_version=str(meta.get("resourceVersion") or ""),
        done=phase in _DONE_PHASES or bool(meta.get("deletionTimestamp")),
        bound=bool(spec.get("nodeName")),
        requests=pod_requests(spec),
    )


def job_size(job: Mapping[str, Any]) -> int:
    """Pods a Job runs at once now: its parallelism, at most the completions it still lacks."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    if completions is None:
        return parallelism
    succeeded = int((job.get("status") or {}).get("succeeded") or 0)
    return max(0, min(parallelism, int(completions) - succeeded))


@dataclass
class Group:
    """Pods admitted together: a Job's, or one pod's. `expected`: how many pods the group runs at once
    (a Job's `job_size`); None for a pod alone, or a Job that could not be read."""

    namespace: str
    key: str
    pods: list[QueuedPod] = field(default_factory=list)
    expected: int | None = None

    @property
    def live(self) -> list[QueuedPod]:
        return [p for p in self.pods if not p.done]

    @property
    def gated(self) -> list[QueuedPod]:
        return [p for p in self.live if p.gated]

    @property
    def waiting_gpus(self) -> int:
        return sum(p.gpus for p in self.gated)

    @property
    def waiting_requests(self) -> Requests:
        return total(p.requests for p in self.gated)

    @property
    def held_gpus(self) -> int:
        return sum(p.gpus for p in self.live if not p.gated)

    @property
    def created(self) -> str:
        return min((p.created for p in self.gated), default="")

    @property
    def complete(self) -> bool:
        """Every pod the group runs at once exists: admitting it now admits it whole."""
        return self.expected is None or len(self.live) >= self.expected

    @property
    def owner(self) -> str:
        """An owner id beside the operator's "Kind/namespace/name" ones."""
        kind, _, name = self.key.partition("/")
        return f"{kind}/{self.namespace}/{name}"


def groups_of(pods: Iterable[QueuedPod]) -> list[Group]:
    out: dict[tuple[str, str], Group] = {}
    for p in pods:
        out.setdefault((p.namespace, p.group), Group(p.namespace, p.group)).pods.append(p)
    return list(out.values())


def fifo(groups: Iterable[Group], queue_of: Callable[[str], str]) -> dict[str, list[Group]]:
    """The waiting groups of each queue, oldest first (by their oldest gated pod; ties by name)."""
    out: dict[str, list[Group]] = {}
    for g in groups:
        if g.gated:
            out.setdefault(queue_of(g.namespace), []).append(g)
    for gs in out.values():
        gs.sort(key=lambda g: (g.created, g.namespace, g.key))
    return out


def never_fits(g: Group, max_gpus: float | None) -> str | None:
    """Why the group can never be admitted in its queue (None: it can)."""
    total = _whole(g)
    if max_gpus is not None and total > max_gpus + _EPS:
        return f"{g.key} asks for {total} GPUs, more than its queue's maxGPUs of {max_gpus:g}"
    return None


def _whole(g: Group) -> int:
    """A Job's GPUs once all its pods run: its pods' GPUs scaled to the pods it runs at once."""
    live = g.live
    if not live or g.expected is None:
        return g.held_gpus + g.waiting_gpus
    per_pod = max(p.gpus for p in live)
    return max(g.held_gpus + g.waiting_gpus, per_pod * g.expected)


@dataclass(frozen=True, slots=True)
class Decision:
    admit: list[Group]
    never: list[tuple[Group, str]]  # groups that can never fit their queue, and why
    waits: list[tuple[Group, str]] = field(default_factory=list)  # groups left waiting, and why
    # groups whose GPUs fit but whose CPU or memory would pass the queue's quota: (group, reason, message)
    over_quota: list[tuple[Group, str, str]] = field(default_factory=list)


def decide(
    by_queue: Mapping[str, list[Group]],
    max_of: Callable[[str], float | None],
    room: Callable[[Group], float | None],
    admitted: Callable[[Group], None],
    quota: Callable[[Group], tuple[str, str] | None] = lambda g: None,
) -> Decision:
    """BestEffortFIFO per queue: each complete group, oldest first, is admitted if `room` (GPUs its queue
    may still take, None: no queues at all) fits all its waiting GPUs and `quota` (the queue's CPU and
    memory) finds nothing over; one that does not fit is passed over, not waited for. `admitted` is told at
    once, so the next group's room and quota count it."""
    out = Decision([], [])
    for q in sorted(by_queue):
        for g in by_queue[q]:
            why = never_fits(g, max_of(q))
            if why is not None:
                out.never.append((g, why))
                continue
            if not g.complete:
                out.waits.append((g, f"{len(g.live)} of its {g.expected} pods exist"))
                continue
            left = room(g)
            if left is None or left >= g.waiting_gpus - _EPS:
                if (over := quota(g)) is not None:
                    out.over_quota.append((g, *over))
                    out.waits.append((g, over[1]))
                    continue
                out.admit.append(g)
                admitted(g)
            else:
                out.waits.append((g, f"its queue has room for {left:g} of its {g.waiting_gpus} GPUs"))
    return out


def ungated(pod: QueuedPod) -> QueuedPod:
    return replace(pod, gated=False, gates=tuple(x for x in pod.gates if x != contract.SCHEDULING_GATE_QUEUE))


def gate_patch(pod: QueuedPod) -> dict[str, Any]:
    """A merge patch that takes the queue's gate off the pod and keeps any other gate. The list is written
    whole (a merge patch replaces lists), so the pod's resourceVersion guards against a gate added since."""
    rest = [{"name": x} for x in pod.gates if x != contract.SCHEDULING_GATE_QUEUE]
    return {"metadata": {"resourceVersion": pod.resource_version}, "spec": {"schedulingGates": rest or None}}


@dataclass
class QueuedPods:
    """The queued pods as last seen on the pod watch, and what they mean for the division."""

    pods: dict[tuple[str, str], QueuedPod] = field(default_factory=dict)
    sizes: dict[tuple[str, str], int | None] = field(default_factory=dict)  # (ns, group) → expected

    def on_pod(self, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """Keep the pod; whether anything admission depends on changed."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        info = None if deleted else queued_pod(body)
        old = self.pods.get(key)
        if info is None:
            self.pods.pop(key, None)
            return old is not None
        self.pods[key] = info
        return old is None or (old.gated, old.done, old.gpus, old.bound) != (
            info.gated,
            info.done,
            info.gpus,
            info.bound,
        )

    def admitted_unbound(self) -> int:
        """GPUs admitted pods will take once bound (not in the view's GPUs held by pods yet)."""
        return sum(p.gpus for p in self.pods.values() if not p.gated and not p.done and not p.bound)

    def groups(self) -> list[Group]:
        out = groups_of(self.pods.values())
        for g in out:
            g.expected = self.sizes.get((g.namespace, g.key))
        return out

    def admitted_requests(self, queue_of: Callable[[str], str]) -> dict[str, Requests]:
        """CPU and memory each queue's admitted pods request (finished ones hold nothing)."""
        out: dict[str, Requests] = {}
        for p in self.pods.values():
            if not p.gated and not p.done:
                q = queue_of(p.namespace)
                out[q] = out.get(q, Requests()) + p.requests
        return out

    def mark_admitted(self, g: Group) -> None:
        for p in g.gated:
            self.pods[p.key] = ungated(p)

    def held(self, queue_of: Callable[[str], str], *, bound_only: bool = False) -> dict[str, float]:
        """GPUs each queue's admitted pods hold (asked for, whether bound yet or not; `bound_only`: only
        those bound)."""
        out: dict[str, float] = {}
        for p in self.pods.values():
            if not p.gated and not p.done and p.gpus and (p.bound or not bound_only):
                q = queue_of(p.namespace)
                out[q] = out.get(q, 0.0) + p.gpus
        return out

    def waiting(
        self, queue_of: Callable[[str], str], max_of: Callable[[str], float | None], skip: Group | None = None
    ) -> dict[str, float]:
        """GPUs each queue's gated groups wait for (leaving out `skip`, and groups that can never fit)."""
        out: dict[str, float] = {}
        for g in self.groups():
            if not g.waiting_gpus or (
                skip is not None and (g.namespace, g.key) == (skip.namespace, skip.key)
            ):
                continue
            q = queue_of(g.namespace)
            if never_fits(g, max_of(q)) is None:
                out[q] = out.get(q, 0.0) + g.waiting_gpus
        return out

    def holdings(self, queue_of: Callable[[str], str]) -> list[Holding]:
        """Each group's bound GPUs as a holding of its queue: counted, never taken (not preemptible, and
        held "since forever", so no minimum runtime ever passes)."""
        out = []
        for g in self.groups():
            gpus = sum(p.gpus for p in g.live if not p.gated and p.bound)
            if gpus:
                out.append(
                    Holding(
                        queue_of(g.namespace), g.owner, float(gpus), math.inf, math.inf, preemptible=False
                    )
                )
        return out


RoomFn = Callable[[str, int, "Group"], float | None]
QuotaFn = Callable[["Group"], tuple[str, str] | None]


class QueueGate:
    """Admission passes over the queued pods. `room(namespace, want, group)`: GPUs the group's queue may
    take now, its own wait left out (Controller.queue_room); `max_of(queue)`: its maxGPUs; `quota(group)`:
    (reason, message) when the group's CPU or memory would pass its queue's maxCPU or maxMemory."""

    def __init__(
        self,
        book: QueuedPods,
        queue_of: Callable[[str], str],
        max_of: Callable[[str], float | None],
        room: RoomFn,
        post_event: Callable[[dict[str, Any], str, str, str], None],
        quota: QuotaFn = lambda g: None,
    ) -> None:
        self.book, self.queue_of, self.max_of, self.room = book, queue_of, max_of, room
        self.post_event, self.quota = post_event, quota
        # (namespace, group) → (reason, message) of the groups the last pass held back for CPU or memory
        self.over_quota: dict[tuple[str, str], tuple[str, str]] = {}
        self.warned: set[str] = set()  # pods told their group can never fit (one event each)
        self.lock = asyncio.Lock()
        self.passes = 0
        # After each pass: queue → (owner id, GPUs waited for, why) of each group still waiting, oldest
        # first (for a Queue's status: its pending workloads and why each waits).
        self.pending: dict[str, list[tuple[str, int, str]]] = {}

    async def run(self, api: Any) -> list[Group]:
        """One pass: read the waiting Jobs' sizes, decide, take the gates off; returns the admitted groups."""
        async with self.lock:
            self.passes += 1
            groups = self.book.groups()
            # A Job is read while it looks incomplete (it may have changed), not again once complete.
            for g in groups:
                if g.gated and g.key.startswith("Job/") and (g.expected is None or not g.complete):
                    await self._size(api, g)
            known = {(g.namespace, g.key) for g in groups}
            self.book.sizes = {k: v for k, v in self.book.sizes.items() if k in known}
            self.warned &= {p.uid for p in self.book.pods.values()}
            by_queue = fifo(self.book.groups(), self.queue_of)

            def room(g: Group) -> float | None:
                return self.room(g.namespace, g.waiting_gpus, g)

            decision = decide(by_queue, self.max_of, room, self.book.mark_admitted, self.quota)
            self.over_quota = {(g.namespace, g.key): (r, m) for g, r, m in decision.over_quota}
            pending: dict[str, list[tuple[str, int, str]]] = {}
            for g, why in [*decision.waits, *decision.never]:
                q = self.queue_of(g.namespace)
                pending.setdefault(q, []).append((g.owner, g.waiting_gpus, why))
            self.pending = pending
            for g, why in decision.never:
                for p in g.gated:
                    if p.uid not in self.warned:
                        self.warned.add(p.uid)
                        self.post_event(_pod_ref(p), "Warning", "QueueTooSmall", f"never admitted: {why}")
            admitted = []
            for g in decision.admit:
                # The decision marked the group admitted in the book: its pods as they were read.
                pods = g.gated
                what = f"{sum(p.gpus for p in pods)} GPU(s) of {_group_name(g.key)}"
                ok = True
                for p in pods:
                    ok = await self._ungate(api, p, what) and ok
                if ok:
                    admitted.append(g)
            return admitted

    async def _size(self, api: Any, g: Group) -> None:
        """The Job's pods at once (`job_size`), read afresh for a waiting Job; a Job that cannot be read is
        admitted with the pods it has."""
        name = g.key.partition("/")[2]
        try:
            size: int | None = job_size(await api.get(JOBS, g.namespace, name))
        except KubeError as err:
            log.warning("Job %s/%s not read (%s): admitted with the pods it has", g.namespace, name, err)
            size = None
        self.book.sizes[(g.namespace, g.key)] = size

    async def _ungate(self, api: Any, p: QueuedPod, what: str) -> bool:
        try:
            await api.patch(PODS, p.namespace, p.name, gate_patch(p))
        except KubeError as err:
            # 409: the pod changed since it was read; 404: it is gone. The watch brings the news and a
            # new pass.
            log.info("queue gate of pod %s/%s not removed: %s", p.namespace, p.name, err)
            if err.status == 404:
                self.book.pods.pop(p.key, None)
            else:
                self.book.pods[p.key] = p  # still gated, as far as this operator knows
            return False
        q = self.queue_of(p.namespace)
        self.post_event(_pod_ref(p), "Normal", "Admitted", f"queue {q} has room for {what}")
        return True


def _group_name(group: str) -> str:
    kind, _, name = group.partition("/")
    return f"Job {name}" if kind == "Job" else "the pod"


def _pod_ref(p: QueuedPod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
    }


def group_workloads(
    book: QueuedPods,
    queue_of: Callable[[str], str],
    max_of: Callable[[str], float | None],
    first_seen: dict[tuple[str, str], float],
    now: float,
    over_quota: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> list[tuple[str, Workload]]:
    """Each queued group as its Queue's status counts it: kind Job or Pod, the GPUs its admitted pods hold
    and those its gated pods wait for. A group that can never fit its queue waits for nothing (its pods are
    told by event). `first_seen` keeps when each group was first seen waiting, on the operator's clock;
    `over_quota`, the groups the gate's last pass held back for CPU or memory, and why."""
    out: list[tuple[str, Workload]] = []
    live: set[tuple[str, str]] = set()
    for g in book.groups():
        if not g.live:
            continue
        q = queue_of(g.namespace)
        kind, _, name = g.key.partition("/")
        wants = g.waiting_gpus if g.gated and never_fits(g, max_of(q)) is None else 0
        reason = message = ""
        if wants:
            live.add((g.namespace, g.key))
            if not g.complete:
                reason, message = (
                    WAITING_FOR_PODS,
                    f"{kind} {name}: {len(g.live)} of its {g.expected} pods exist",
                )
            elif over_quota and (g.namespace, g.key) in over_quota:
                reason, message = over_quota[(g.namespace, g.key)]
        since = first_seen.setdefault((g.namespace, g.key), now) if wants else now
        w = Workload(
            "Job" if kind == "Job" else "Pod",
            g.namespace,
            name,
            float(g.held_gpus),
            float(wants),
            since,
            reason,
            message,
        )
        out.append((q, w))
    for k in set(first_seen) - live:
        del first_seen[k]
    return out
