"""Make a workload's pods match its plan: create what is missing as gangs, delete what is no longer planned.

Pods are named from their plan (`PodPlan.name`), so the diff is a set difference of names and running it
twice changes nothing. A gang (one job's or one trial's pods) is created all or nothing: if any create
fails, the pods of that gang created in this pass are deleted again and the failure is reported.
Deletes, and the creates of each gang, go out together with at most `concurrency` requests in flight.
A `RecentCreates` shared by a controller's passes counts pods it has just asked for as present until its
pod watch shows them, so two passes close together do not send the same create twice.

In DRA mode (`dra`) each pod comes with its ResourceClaimTemplate (`dra.py`), created just before the pod
and deleted just before it: a pass cut short in between leaves a pod that the next pass deletes (or a template
it re-creates, 409), never a template with no pod to delete it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.controller.concurrency import gather_limited
from tessera.controller.dra import (
    RESOURCE_CLAIM_TEMPLATES,
    DraLanes,
    LanesError,
    claim_requests,
    claim_template,
)
from tessera.controller.kube import PODS, KubeApi, KubeError
from tessera.controller.pods import JsonObj, Owner, PodPlan, build_pod
from tessera.controller.view import PodInfo

log = logging.getLogger(__name__)


class RecentCreates:
    """Pod names this controller created (or is creating) that its watch may not list yet. An entry goes
    when the watch lists the pod, when its create fails, or after `ttl_s` (a pod deleted before the watch
    saw it is then created again)."""

    def __init__(self, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._since: dict[tuple[str, str], float] = {}
        self._swept = clock()

    def add(self, namespace: str, names: Sequence[str]) -> None:
        now = self.clock()
        if now - self._swept > self.ttl_s:  # entries no caller asks about any more expire here
            self._since = {k: t for k, t in self._since.items() if now - t <= self.ttl_s}
            self._swept = now
        for n in names:
            self._since[(namespace, n)] = now

    def discard(self, namespace: str, names: Sequence[str]) -> None:
        for n in names:
            self._since.pop((namespace, n), None)

    def pending(self, namespace: str, listed: set[str], among: Iterable[str] | None = None) -> set[str]:
        """Names in `namespace` still expected (not listed, not expired); forgets the others. With `among`
        (the names a caller plans) only those are looked at: a round asks once per workload, and a scan of
        every recent create each time made a round with N workloads cost N² (1000 Apps: 0.5 s)."""
        now = self.clock()
        if among is None:
            keys = [k for k in self._since if k[0] == namespace]
        else:
            keys = [(namespace, n) for n in among if (namespace, n) in self._since]
        out: set[str] = set()
        for key in keys:
            if key[1] in listed or now - self._since[key] > self.ttl_s:
                del self._since[key]
            else:
                out.add(key[1])
        return out


@dataclass
class SyncResult:
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed_gangs: dict[str, str] = field(default_factory=dict)  # gang → why

    @property
    def changed(self) -> bool:
        return bool(self.created or self.deleted or self.failed_gangs)


@dataclass(frozen=True, slots=True)
class PodSync:
    """Makes an object's pods match its plan, with the operator's preemption grace (`grace_seconds` to
    checkpoint after SIGTERM) and the node agent's socket group for every pod it creates; with `dra`, each
    pod's lane is a ResourceClaimTemplate selecting its planned GPUs."""

    api: KubeApi
    grace_seconds: int
    socket_group: int = 0
    dra: DraLanes | None = None

    async def __call__(
        self,
        owner: Owner,
        plans: Sequence[PodPlan],
        existing: Sequence[PodInfo],
        *,
        gang_of: Callable[[PodPlan], str],
        template_of: Callable[[PodPlan], Mapping[str, Any]],
        workload_class: str,
        recent: RecentCreates | None = None,
        concurrency: int = 1,
    ) -> SyncResult:
        """Delete unplanned pods, then create the planned gangs that are missing."""
        out = SyncResult()
        wanted = {p.name for p in plans}
        doomed = [
            p.name for p in sorted(existing, key=lambda p: p.name) if p.name not in wanted and not p.deleting
        ]
        deletes = await gather_limited((self._delete(owner.namespace, n) for n in doomed), concurrency)
        for name, res in zip(doomed, deletes, strict=True):
            if isinstance(res, BaseException):
                raise res
            out.deleted.append(name)
        have = {p.name for p in existing if not p.deleting}
        if recent is not None:
            have |= recent.pending(owner.namespace, {p.name for p in existing}, wanted)
        gangs: dict[str, list[PodPlan]] = {}
        for plan in plans:
            gangs.setdefault(gang_of(plan), []).append(plan)
        gang = _Gang(
            self.api, owner, template_of, workload_class, self.socket_group, concurrency, recent, self.dra
        )
        for name, members in gangs.items():
            missing = [m for m in members if m.name not in have]
            try:
                out.created.extend(await gang.create(name, missing))
            except (KubeError, LanesError) as err:
                out.failed_gangs[name] = str(err)
        return out

    async def _delete(self, namespace: str, name: str) -> None:
        if self.dra is not None:
            await self.api.delete(RESOURCE_CLAIM_TEMPLATES, namespace, name)
        await self.api.delete(PODS, namespace, name, grace_seconds=self.grace_seconds)


@dataclass(frozen=True, slots=True)
class _Gang:
    """Creates one gang's missing pods all or nothing."""

    api: KubeApi
    owner: Owner
    template_of: Callable[[PodPlan], Mapping[str, Any]]
    workload_class: str
    socket_group: int
    concurrency: int
    recent: RecentCreates | None
    dra: DraLanes | None = None

    async def create(self, gang: str, missing: Sequence[PodPlan]) -> list[str]:
        """The names created; on a refused create, the ones made are deleted again and the error raised."""
        ns = self.owner.namespace
        if self.recent is not None:  # before the first await, so a concurrent pass sees them
            self.recent.add(ns, [m.name for m in missing])
        creates = await gather_limited((self._create(m) for m in missing), self.concurrency)
        made = [m.name for m, res in zip(missing, creates, strict=True) if not isinstance(res, BaseException)]
        errors = [res for res in creates if isinstance(res, BaseException)]
        if self.recent is not None:
            self.recent.discard(ns, [m.name for m in missing if m.name not in made])
        if not errors:
            return made
        err = errors[0]
        if not isinstance(err, KubeError | LanesError):
            raise err
        log.warning("gang %s of %s/%s failed: %s", gang, ns, self.owner.name, err)
        await self._undo(gang, made, [m.name for m in missing])
        raise err

    async def _create(self, plan: PodPlan) -> JsonObj:
        ns = self.owner.namespace
        pod = build_pod(
            self.template_of(plan),
            plan,
            self.owner,
            self.workload_class,
            self.socket_group,
            dra=self.dra is not None,
        )
        if self.dra is not None:
            uuids = self.dra.uuids(plan.node, plan.gpu_indices)
            requests = claim_requests(uuids, plan.memory_mib, plan.compute_percent)
            template = claim_template(plan.name, ns, pod["metadata"], requests)
            await self.api.create(RESOURCE_CLAIM_TEMPLATES, ns, template)
        return await self.api.create(PODS, ns, pod)

    async def _undo(self, gang: str, made: list[str], tried: list[str]) -> None:
        ns = self.owner.namespace
        if self.recent is not None:
            self.recent.discard(ns, made)
        undone = await gather_limited(
            (self.api.delete(PODS, ns, name, grace_seconds=0) for name in made), self.concurrency
        )
        for name, res in zip(made, undone, strict=True):
            if isinstance(res, BaseException):
                log.warning("pod %s/%s of failed gang %s not removed: %s", ns, name, gang, res)
        if self.dra is None:
            return
        # every pod tried may have got its template before its own create failed
        gone = await gather_limited(
            (self.api.delete(RESOURCE_CLAIM_TEMPLATES, ns, name) for name in tried), self.concurrency
        )
        for name, res in zip(tried, gone, strict=True):
            if isinstance(res, BaseException):
                log.warning("claim template %s/%s of failed gang %s not removed: %s", ns, name, gang, res)
