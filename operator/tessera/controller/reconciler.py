"""Plumbing shared by the TrialGroup and ModelDeployment controllers: their dependencies, the lock that
serialises their passes, the parse-or-report prelude, the Ready condition and observedGeneration after
each pass, and events about one object.

The per-kind logic (what to plan, which pods to create, what Ready means) stays in the subclasses.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import kopf

from tessera.api.resources import ManifestError
from tessera.controller.conditions import (
    Cond,
    Readiness,
    carry,
    find,
    generation_of,
    invalid_status,
    with_ready,
)
from tessera.controller.context import Context
from tessera.controller.liveness import PassClock
from tessera.controller.pods import Owner, PodPlan, template_errors
from tessera.controller.queues import QUEUE_RESOLVED, membership_news
from tessera.controller.readiness import missing_pods
from tessera.controller.sync import RecentCreates, SyncResult


class Record(Protocol):
    name: str
    namespace: str
    uid: str


R = TypeVar("R", bound=Record)


class KindReconciler(abc.ABC, Generic[R]):
    kind: str  # contract.KIND_*: the kind events are posted about

    def __init__(self, ctx: Context, held_elsewhere: Callable[[], set[str]]) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.view = ctx.view
        self.api = ctx.api
        self.metrics = ctx.metrics
        self.post_event = ctx.post_event
        self.held_elsewhere = held_elsewhere  # GPUs the other kinds hold (leases, pools, serving workers)
        self.records: dict[tuple[str, str], R] = {}
        self.lock = asyncio.Lock()
        self.recent = RecentCreates()  # pods created that the watch may not list yet
        self.reconciles = 0  # completed passes (tests wait on it instead of on time)
        self.passes = PassClock(ctx.config.clock)  # for the liveness probe
        # Why this pass refused the object (Ready is written with that report); None: not refused.
        self._refused: str | None = None
        self._ready: dict[str, dict[str, Any]] = {}  # uid → the Ready condition last written
        # The QueueResolved condition of an object of a namespace (None: the namespace names no queue);
        # set by the Controller from its QueueBook. uid → the one last written (None: none was).
        self.queue_condition: Callable[[str, int | None], Cond | None] = lambda namespace, gen: None
        self._queue: dict[str, Cond | None] = {}
        # uid → (message, generation) last reported invalid: the create handler and the timer may both
        # pass over the object before either sees the other's patch.
        self._reported: dict[str, tuple[str, int | None]] = {}

    async def reconcile(self, body: dict[str, Any], patch: kopf.Patch) -> str | None:
        """One pass over the object; returns why it was refused (an invalid spec), else None."""
        async with self.lock:
            self._refused = None
            with self.passes.timing():
                await self._reconcile(body, patch)
            self.reconciles += 1
            if self._refused is None:
                self._reported.pop(str((body.get("metadata") or {}).get("uid", "")), None)
                self._report_ready(body, patch)
            return self._refused

    @abc.abstractmethod
    async def _reconcile(self, body: dict[str, Any], patch: kopf.Patch) -> None: ...

    @abc.abstractmethod
    async def delete(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Forget the deleted object and remove what it owns."""

    def discard(self, uid: str) -> None:
        """Forget what was reported about a deleted object (its Ready and QueueResolved conditions, an
        invalid spec)."""
        self._ready.pop(uid, None)
        self._queue.pop(uid, None)
        self._reported.pop(uid, None)

    @abc.abstractmethod
    def readiness(self, rec: R) -> Readiness | None:
        """The Ready condition of `rec` after a pass over it; None leaves it as it is (not known yet)."""

    def missing_pods(self, rec: R, label: str, plans: list[PodPlan]) -> list[PodPlan]:
        existing = self.view.pods_with(label, rec.name, rec.namespace)
        return missing_pods(plans, existing, self.recent, rec.namespace)

    def _report_ready(self, body: dict[str, Any], patch: kopf.Patch) -> None:
        """Ready, QueueResolved and observedGeneration after a pass, written with the conditions the pass
        set (a merge patch replaces the list) or, when it set none, with the ones the object holds. A change
        of QueueResolved is posted as an event once (`membership_news`)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        rec = self.records.get(key)
        if rec is None or rec.uid != str(meta.get("uid", "")) or not len(self.view.cluster()):
            return  # forgotten, or the node watch has not listed yet: nothing is known
        ready = self.readiness(rec)
        if ready is None:
            return
        status_in = body.get("status") or {}
        stored: list[dict[str, Any]] = list(status_in.get("conditions") or [])
        written: list[dict[str, Any]] = patch.status.get("conditions") or []
        gen = generation_of(body)
        queue = self.queue_condition(rec.namespace, gen)
        own = [
            c
            for c in (written if "conditions" in patch.status else stored)
            if c.get("type") != QUEUE_RESOLVED
        ]
        own += [queue] if queue is not None else []
        if gen is not None:  # the pass re-evaluated the kind's own conditions against this generation too
            own = [{**c, "observedGeneration": gen} for c in own]
        # Ready's and QueueResolved's transition times, and whether QueueResolved is news, from what this
        # operator last wrote: the body may predate that write.
        last = self._ready.get(rec.uid)
        if rec.uid in self._queue:
            mine = self._queue[rec.uid]
            before = [mine] if mine is not None else []
        else:
            before = stored
        conditions = with_ready(own, ready, gen, ([last] if last else []) + before + stored)
        if len(self._ready) > len(self.records) or len(self._queue) > len(self.records):
            live = {r.uid for r in self.records.values()}
            self._ready = {uid: c for uid, c in self._ready.items() if uid in live}
            self._queue = {uid: c for uid, c in self._queue.items() if uid in live}
        self._ready[rec.uid] = dict(find(conditions, "Ready") or {})
        resolved = find(conditions, QUEUE_RESOLVED)
        self._queue[rec.uid] = dict(resolved) if resolved is not None else None
        news = membership_news(resolved, before)
        if news is not None:
            self._event(rec, *news)
        if "conditions" in patch.status or conditions != stored or status_in.get("observedGeneration") != gen:
            patch.status["conditions"] = conditions
            if gen is not None:
                patch.status["observedGeneration"] = gen

    def _parse(
        self, body: dict[str, Any], patch: kopf.Patch, record_from_body: Callable[[dict[str, Any]], R]
    ) -> R | None:
        """The object's record, or None after reporting why it is invalid (condition + event, once)."""
        try:
            fresh = record_from_body(body)
        except ManifestError as err:
            self._invalid(body, patch, invalid_status(err))
            return None
        bad = template_errors((body.get("spec") or {}).get("template"), "spec.template")
        if bad:
            self._invalid(body, patch, invalid_status(bad))
            return None
        return fresh

    def _invalid(self, body: dict[str, Any], patch: kopf.Patch, report: tuple[dict[str, Any], str]) -> None:
        """Report the object refused: phase Failed, Valid and Ready False (InvalidSpec), one event per
        distinct message; a spec change that is still invalid moves observedGeneration only."""
        status, msg = report
        self._refused = msg
        status_in = body.get("status") or {}
        stored = status_in.get("conditions") or []
        gen = generation_of(body)
        uid = str((body.get("metadata") or {}).get("uid", ""))
        valid = find(stored, "Valid")
        last = self._reported.get(uid)
        same = (status_in.get("phase") == "Failed" and valid is not None and valid.get("message") == msg) or (
            last is not None and last[0] == msg
        )
        if last == (msg, gen) or (same and status_in.get("observedGeneration") == gen):
            return  # reported already; a repeat would only add events
        self._reported[uid] = (msg, gen)
        status = dict(status)
        if gen is not None:
            status["observedGeneration"] = gen
            status["conditions"] = [{**c, "observedGeneration": gen} for c in status["conditions"]]
        status["conditions"] = carry(status["conditions"], stored)
        patch.status.update(status)
        if not same:
            self.post_event(body, "Warning", "InvalidSpec", msg)

    def _report_sync(
        self,
        rec: R,
        result: SyncResult,
        *,
        created: str,
        deleted: str,
        failed: str = "{gang}: no pods created: {why}",
    ) -> None:
        """Events for what a pod sync did: `created` and `deleted` are the reasons, `failed` the message of
        a GangFailed event (with the gang and why)."""
        if result.deleted:
            self._event(rec, "Normal", deleted, ", ".join(result.deleted))
        if result.created:
            self._event(rec, "Normal", created, ", ".join(result.created))
        for gang, why in result.failed_gangs.items():
            self._event(rec, "Warning", "GangFailed", failed.format(gang=gang, why=why))

    def owner(self, rec: R) -> Owner:
        return Owner(self.kind, rec.name, rec.namespace, rec.uid)

    def _event(self, rec: R, type_: str, reason: str, message: str) -> None:
        self.ctx.event(self.owner(rec), type_, reason, message)
