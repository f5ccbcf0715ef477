"""Per-namespace usage from the pod watch: GPUs held and pods waiting, by workload kind.

Feeds `tessera_namespace_gpus` and `tessera_pending_pods` (tessera.api.metrics_catalog). Only pods the
operator created count: App workers (training), TrialGroup trial pods (trial) and ModelDeployment workers
(serving); they are recognised by the owner label the operator puts on them (contract.LABEL_*).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tessera.api import contract
from tessera.controller.view import PodInfo, gpu_id
from tessera.metrics import ComponentMetrics

WORKLOADS = (contract.WORKLOAD_TRAINING, contract.WORKLOAD_TRIAL, contract.WORKLOAD_SERVING)


def workload_of(pod: PodInfo) -> str | None:
    """The workload kind of a pod the operator created; None for any other pod (gateways included)."""
    if contract.LABEL_APP in pod.labels:
        return contract.WORKLOAD_TRAINING
    if contract.LABEL_TRIALGROUP in pod.labels:
        return contract.WORKLOAD_TRIAL
    if contract.LABEL_MODELDEPLOYMENT in pod.labels and pod.labels.get(contract.LABEL_ROLE) == "worker":
        return contract.WORKLOAD_SERVING
    return None


def is_pending(pod: PodInfo) -> bool:
    """Waiting for its GPU: not bound to a node by the scheduler and not running yet."""
    return pod.phase == "Pending" and not pod.bound and not pod.deleting


@dataclass(slots=True)
class Usage:
    gpus: dict[tuple[str, str], int] = field(default_factory=dict)  # (namespace, workload) → GPUs
    pending: dict[tuple[str, str], int] = field(default_factory=dict)  # (namespace, workload) → pods


def usage_of(pods: Iterable[PodInfo]) -> Usage:
    """Distinct GPUs held (a GPU shared by packed pods counts once per namespace and kind) and pending pods."""
    held: dict[tuple[str, str], set[str]] = {}
    out = Usage()
    for pod in pods:
        kind = workload_of(pod)
        if kind is None:
            continue
        key = (pod.namespace, kind)
        if pod.holds_gpus and not pod.deleting and pod.node is not None:
            held.setdefault(key, set()).update(gpu_id(pod.node, i) for i in pod.gpu_indices)
        if is_pending(pod):
            out.pending[key] = out.pending.get(key, 0) + 1
    out.gpus = {k: len(v) for k, v in held.items()}
    return out


class UsageMetrics:
    """Sets the two gauges from the pod view; series that drop to nothing are set to 0, not left stale."""

    def __init__(self, metrics: ComponentMetrics, delay_s: float = 0.2) -> None:
        self.metrics = metrics
        self.delay_s = delay_s
        self._seen: set[tuple[str, str]] = set()
        self._due: asyncio.TimerHandle | None = None

    def update_soon(self, pods: Callable[[], Iterable[PodInfo]]) -> None:
        """Recount within `delay_s`, once for all the pod events until then. A recount walks every pod;
        run per event, a round that creates and deletes hundreds of pods made it O(pods²) on the loop."""
        if self._due is not None:
            return

        def recount() -> None:
            self._due = None
            self.update(pods())

        self._due = asyncio.get_running_loop().call_later(self.delay_s, recount)

    def update(self, pods: Iterable[PodInfo]) -> Usage:
        usage = usage_of(pods)
        keys = self._seen | usage.gpus.keys() | usage.pending.keys()
        gpus = self.metrics.gauge("tessera_namespace_gpus")
        pending = self.metrics.gauge("tessera_pending_pods")
        for ns, kind in keys:
            gpus.labels(namespace=ns, workload=kind).set(usage.gpus.get((ns, kind), 0))
            pending.labels(namespace=ns, workload=kind).set(usage.pending.get((ns, kind), 0))
        self._seen = keys
        return usage
