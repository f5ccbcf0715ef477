"""Make a workload's pods match its plan: create what is missing as gangs, delete what is no longer planned.

Pods are named from their plan (`PodPlan.name`), so the diff is a set difference of names and running it
twice changes nothing. A gang (one job's or one trial's pods) is created all or nothing: if any create
fails, the pods of that gang created in this pass are deleted again and the failure is reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.controller.kube import PODS, KubeApi, KubeError
from tessera.controller.pods import Owner, PodPlan, build_pod
from tessera.controller.view import PodInfo

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed_gangs: dict[str, str] = field(default_factory=dict)  # gang → why

    @property
    def changed(self) -> bool:
        return bool(self.created or self.deleted or self.failed_gangs)


async def sync_pods(
    api: KubeApi,
    owner: Owner,
    plans: Sequence[PodPlan],
    existing: Sequence[PodInfo],
    *,
    gang_of: Callable[[PodPlan], str],
    template_of: Callable[[PodPlan], Mapping[str, Any]],
    workload_class: str,
    grace_seconds: int,
) -> SyncResult:
    """Delete unplanned pods (with `grace_seconds` to checkpoint after SIGTERM), then create planned gangs."""
    out = SyncResult()
    wanted = {p.name for p in plans}
    for pod in sorted(existing, key=lambda p: p.name):
        if pod.name not in wanted and not pod.deleting:
            await api.delete(PODS, owner.namespace, pod.name, grace_seconds=grace_seconds)
            out.deleted.append(pod.name)
    have = {p.name for p in existing if not p.deleting}
    gangs: dict[str, list[PodPlan]] = {}
    for plan in plans:
        gangs.setdefault(gang_of(plan), []).append(plan)
    for gang, members in gangs.items():
        missing = [m for m in members if m.name not in have]
        made: list[str] = []
        try:
            for m in missing:
                await api.create(PODS, owner.namespace, build_pod(template_of(m), m, owner, workload_class))
                made.append(m.name)
        except KubeError as err:
            log.warning("gang %s of %s/%s failed: %s", gang, owner.namespace, owner.name, err)
            out.failed_gangs[gang] = str(err)
            for name in made:
                await api.delete(PODS, owner.namespace, name, grace_seconds=0)
            continue
        out.created.extend(made)
    return out
