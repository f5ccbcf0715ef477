"""CPU and memory quotas of a team queue (`maxCPU`, `maxMemory`): what its pods request, and whether more
fits (docs/queues.md, "CPU, memory and per-model quotas").

A pod's requests are what kube-scheduler reserves for it: per resource, the larger of its containers' sum
and its largest init container (a container's request, else its limit, which the API server copies into an
absent request). A queue's pods are its Apps' pods (one per job and node of their leases, each with its
job's template) and the pods admitted through its gate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from tessera.api import contract
from tessera.api.queue import QueueSpec, quantity
from tessera.controller.apps import AppRecord, template_of
from tessera.controller.queue_status import QUEUE_CPU_QUOTA, QUEUE_MEMORY_QUOTA

_GI = 1 << 30


@dataclass(frozen=True, slots=True)
class Requests:
    """CPU (cores) and memory (bytes) requested."""

    cpu: Decimal = Decimal(0)
    memory: Decimal = Decimal(0)

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.cpu + other.cpu, self.memory + other.memory)

    def text(self, reason: str) -> str:
        """The CPU (for QueueCPUQuota) or the memory (QueueMemoryQuota) in words."""
        if reason == QUEUE_CPU_QUOTA:
            return f"{self.cpu.normalize():f} CPU"
        return f"{(self.memory / _GI).quantize(Decimal('0.01')).normalize():f}Gi memory"


def total(items: Iterable[Requests]) -> Requests:
    out = Requests()
    for r in items:
        out = out + r
    return out


def _container(c: Mapping[str, Any], name: str) -> Decimal:
    res = c.get("resources") or {}
    value = (res.get("requests") or {}).get(name, (res.get("limits") or {}).get(name))
    if value is None:
        return Decimal(0)
    try:
        return quantity(str(value))
    except ValueError:  # the API server refuses such a pod; an unreadable template counts nothing
        return Decimal(0)


def pod_requests(spec: Mapping[str, Any]) -> Requests:
    """The CPU and memory kube-scheduler reserves for a pod of this spec."""
    out = []
    for name in ("cpu", "memory"):
        run = sum((_container(c, name) for c in spec.get("containers") or []), Decimal(0))
        init = max((_container(c, name) for c in spec.get("initContainers") or []), default=Decimal(0))
        out.append(max(run, init))
    return Requests(out[0], out[1])


def app_requests(rec: AppRecord) -> Requests:
    """What the App's pods request now: one pod per job and node of its leases, each its job's template's."""
    out = Requests()
    for plan in rec.pod_plans():
        template = template_of(rec, plan.labels[contract.LABEL_JOB])
        out = out + pod_requests(template.get("spec") or {})
    return out


def app_pod(rec: AppRecord) -> Requests:
    """The most one more pod of the App may request: per resource, the largest of its unfinished jobs'."""
    pods = [pod_requests(template_of(rec, j.name).get("spec") or {}) for j in rec.live_jobs()]
    return Requests(
        max((p.cpu for p in pods), default=Decimal(0)), max((p.memory for p in pods), default=Decimal(0))
    )


def pods_that_fit(spec: QueueSpec, used: Requests, pod: Requests) -> tuple[int, str]:
    """How many more pods of `pod`'s requests fit the queue's maxCPU and maxMemory while its pods request
    `used`, and the reason the tighter bound gives (a large number and "" when neither bounds them)."""
    best, why = 1 << 62, ""
    for limit, have, each, reason in (
        (spec.max_cpu, used.cpu, pod.cpu, QUEUE_CPU_QUOTA),
        (spec.max_memory, used.memory, pod.memory, QUEUE_MEMORY_QUOTA),
    ):
        if limit is None or each <= 0:
            continue
        n = max(0, int((quantity(limit) - have) // each))
        if n < best:
            best, why = n, reason
    return best, why


def quota_block(
    queue: str, spec: QueueSpec, used: Requests, want: Requests, what: str
) -> tuple[str, str] | None:
    """(reason, message) when `want` more (for `what`, e.g. "Job sweep") would take the queue's pods, which
    request `used`, past its maxCPU or maxMemory; None when it fits."""
    for reason, field, limit, after in (
        (QUEUE_CPU_QUOTA, "maxCPU", spec.max_cpu, used.cpu + want.cpu),
        (QUEUE_MEMORY_QUOTA, "maxMemory", spec.max_memory, used.memory + want.memory),
    ):
        if limit is not None and after > quantity(limit):
            return reason, (
                f"{what} requests {want.text(reason)}; queue {queue}'s pods request {used.text(reason)} of its "
                f"{field} {limit}"
            )
    return None
