"""Plumbing shared by the TrialGroup and ModelDeployment controllers: their dependencies, the lock that
serialises their passes, the parse-or-report prelude, and events about one object.

The per-kind logic (what to plan, which pods to create) stays in the subclasses.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import kopf

from tessera.api import contract
from tessera.api.resources import ManifestError
from tessera.controller.arbiter import PostEvent
from tessera.controller.conditions import invalid_status
from tessera.controller.config import OperatorConfig
from tessera.controller.kube import KubeApi
from tessera.controller.pods import template_errors
from tessera.controller.sync import RecentCreates
from tessera.controller.view import ClusterView
from tessera.metrics import ComponentMetrics


class Record(Protocol):
    name: str
    namespace: str
    uid: str


R = TypeVar("R", bound=Record)


class KindReconciler(abc.ABC, Generic[R]):
    kind: str  # contract.KIND_*: the kind events are posted about

    def __init__(
        self,
        config: OperatorConfig,
        view: ClusterView,
        api: KubeApi,
        metrics: ComponentMetrics,
        post_event: PostEvent,
        held_elsewhere: Callable[[], set[str]],
    ) -> None:
        self.config = config
        self.view = view
        self.api = api
        self.metrics = metrics
        self.post_event = post_event
        self.held_elsewhere = held_elsewhere  # GPUs the other kinds hold (leases, pools, serving workers)
        self.records: dict[tuple[str, str], R] = {}
        self.lock = asyncio.Lock()
        self.recent = RecentCreates()  # pods created that the watch may not list yet
        self.reconciles = 0  # completed passes (tests wait on it instead of on time)

    async def reconcile(self, body: dict[str, Any], patch: kopf.Patch) -> None:
        async with self.lock:
            await self._reconcile(body, patch)
            self.reconciles += 1

    @abc.abstractmethod
    async def _reconcile(self, body: dict[str, Any], patch: kopf.Patch) -> None: ...

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
        status, msg = report
        if (body.get("status") or {}).get("phase") == "Failed":
            return  # reported already; a repeat would only add events
        patch.status.update(status)
        self.post_event(body, "Warning", "InvalidSpec", msg)

    def _event(self, rec: R, type_: str, reason: str, message: str) -> None:
        body = {
            "apiVersion": contract.API_VERSION,
            "kind": self.kind,
            "metadata": {"name": rec.name, "namespace": rec.namespace, "uid": rec.uid},
        }
        self.post_event(body, type_, reason, message)
