"""What every controller of the operator works with, built once per operator and passed to each: the
settings, the cluster view, the API client, the metrics and the event poster; and the two jobs every kind
does with them (post an event about an object, make an object's pods match its plan)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.controller.config import OperatorConfig
from tessera.controller.kube import KubeApi
from tessera.controller.pods import Owner, PodPlan
from tessera.controller.sync import RecentCreates, SyncResult, sync_pods
from tessera.controller.view import ClusterView, PodInfo
from tessera.metrics import ComponentMetrics

PostEvent = Callable[[dict[str, Any], str, str, str], None]  # (body, type, reason, message)


@dataclass(frozen=True, slots=True)
class Context:
    config: OperatorConfig
    view: ClusterView
    api: KubeApi
    metrics: ComponentMetrics
    post_event: PostEvent

    def event(self, owner: Owner, type_: str, reason: str, message: str) -> None:
        """An event about `owner` (its kind, name, namespace and uid are all an event needs)."""
        self.post_event(owner.body(), type_, reason, message)

    async def sync_pods(
        self,
        owner: Owner,
        plans: Sequence[PodPlan],
        existing: Sequence[PodInfo],
        *,
        gang_of: Callable[[PodPlan], str],
        template_of: Callable[[PodPlan], Mapping[str, Any]],
        workload_class: str,
        recent: RecentCreates,
        concurrency: int = 1,
    ) -> SyncResult:
        """`sync.sync_pods` with the operator's preemption grace and socket group."""
        return await sync_pods(
            self.api,
            owner,
            plans,
            existing,
            gang_of=gang_of,
            template_of=template_of,
            workload_class=workload_class,
            grace_seconds=self.config.preemption_grace_s,
            concurrency=concurrency,
            recent=recent,
            socket_group=self.config.socket_group,
        )
