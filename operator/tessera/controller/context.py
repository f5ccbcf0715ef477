"""What every controller of the operator works with, built once per operator and passed to each: the
settings, the cluster view, the API client, the metrics and the event poster; and the two jobs every kind
does with them (post an event about an object, make an object's pods match its plan)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.controller.config import OperatorConfig
from tessera.controller.dra import DraLanes
from tessera.controller.kube import KubeApi
from tessera.controller.pods import Owner
from tessera.controller.sync import PodSync
from tessera.controller.view import ClusterView
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

    @property
    def sync_pods(self) -> PodSync:
        """Make an object's pods match its plan (`PodSync`), with the operator's preemption grace, the
        node agent's socket group and, with `--lanes-api dra`, a claim template per pod."""
        dra = DraLanes(self.view) if self.config.lanes_api == "dra" else None
        return PodSync(self.api, self.config.preemption_grace_s, self.config.socket_group, dra)
