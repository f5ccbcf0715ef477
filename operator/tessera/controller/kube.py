"""The operator's own Kubernetes calls: create/delete pods and children, patch status of other objects.

kopf owns watching and the patches of the object a handler runs for; everything else the controller does
(pods of an App, status of Apps an arbiter round touched, gateway Deployments) goes through Tessera's one
client (`tessera.kube`), logged in with the same credentials as kopf. Every call is recorded as
(api group, resource, verb) so tests can check them against the RBAC rules in `rbac.py`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from tessera.kube import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    PODS,
    SERVICES,
    JsonObj,
    Kind,
    KubeClient,
    KubeConfig,
    KubeError,
)

__all__ = ["CONFIGMAPS", "DEPLOYMENTS", "EVENTS", "PODS", "SERVICES", "Kind", "KubeApi", "KubeError"]

log = logging.getLogger(__name__)


@dataclass
class KubeApi:
    """Typed calls over one shared client (one connection pool); `calls` records (group, plural[/sub],
    verb) for RBAC checks and `counts` how many requests each of those made (the benchmark's API calls per round). `seconds`
    sums each request's latency per call (overlapping requests both count) and `busy_s` the wall time with
    at least one request in flight (up to the last time none was; `busy_seconds()` up to now), so a
    benchmark can tell a round's time waiting on the server."""

    conn: kopf.ConnectionInfo
    calls: set[tuple[str, str, str]] = field(default_factory=set)
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    seconds: defaultdict[tuple[str, str, str], float] = field(default_factory=lambda: defaultdict(float))
    busy_s: float = 0.0
    _in_flight: int = 0
    _busy_since: float = 0.0
    # Built once, on the first call: one pool, one SSL context (a context made per request never reused a
    # connection and paid a TLS handshake on every call).
    _client: KubeClient | None = None
    # Events are best effort and come in bursts (hundreds in a 1000-App round). Unbounded, they filled the
    # session's connection pool and the round's pod and status writes queued behind them.
    events_in_flight: int = 4
    _event_gate: asyncio.Semaphore | None = None

    def busy_seconds(self) -> float:
        """`busy_s` with the stretch of requests in flight right now included."""
        return self.busy_s + (time.perf_counter() - self._busy_since if self._in_flight else 0.0)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _call(
        self,
        verb: str,
        kind: Kind,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        sub: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> JsonObj:
        call = (kind.group, kind.plural + (f"/{sub}" if sub else ""), verb)
        self.calls.add(call)
        self.counts[call] += 1
        if self._client is None:
            self._client = KubeClient(KubeConfig.from_kopf(self.conn))
        t0 = time.perf_counter()
        if not self._in_flight:
            self._busy_since = t0
        self._in_flight += 1
        try:
            return await self._client.request(method, path, query=query, body=body, content_type=content_type)
        finally:
            t1 = time.perf_counter()
            self.seconds[call] += t1 - t0
            self._in_flight -= 1
            if not self._in_flight:
                self.busy_s += t1 - self._busy_since

    async def get(self, kind: Kind, namespace: str, name: str) -> JsonObj:
        """One object (the arbiter's ledger, read once at start; everything else comes from watches)."""
        return await self._call("get", kind, "GET", kind.path(namespace, name))

    async def create(self, kind: Kind, namespace: str, obj: JsonObj, *, exists_ok: bool = True) -> JsonObj:
        """Create; an object of that name already there counts as done (409), so reconciles repeat safely
        (without `exists_ok` the 409 is raised)."""
        try:
            return await self._call("create", kind, "POST", kind.path(namespace), body=obj)
        except KubeError as err:
            if err.status == 409 and exists_ok:
                return obj
            raise

    async def delete(
        self, kind: Kind, namespace: str, name: str, *, grace_seconds: int | None = None
    ) -> None:
        """Delete; already gone (404) counts as done. `grace_seconds` is the pod's SIGTERM→SIGKILL window."""
        body = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else None
        query = {"gracePeriodSeconds": str(grace_seconds)} if grace_seconds is not None else None
        try:
            await self._call("delete", kind, "DELETE", kind.path(namespace, name), body=body, query=query)
        except KubeError as err:
            if err.status != 404:
                raise

    async def patch(
        self, kind: Kind, namespace: str, name: str, body: JsonObj, *, sub: str | None = None
    ) -> JsonObj:
        """JSON merge patch of the object (or of its `sub` subresource, e.g. status)."""
        return await self._call(
            "patch",
            kind,
            "PATCH",
            kind.path(namespace, name, sub),
            body=body,
            content_type="application/merge-patch+json",
            sub=sub,
        )

    async def post_event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `obj`, named `<obj>.<random hex>` as kubectl's clients do (explicit
        names rather than generateName, which kmock's emulator does not implement)."""
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        now = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{secrets.token_hex(8)}", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace") or "",  # empty for a cluster-scoped object (a Queue)
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "tessera-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if self._event_gate is None:
            self._event_gate = asyncio.Semaphore(self.events_in_flight)
        try:
            async with self._event_gate:
                await self._call("create", EVENTS, "POST", EVENTS.path(ns), body=event)
        except KubeError as err:  # an event is best effort: never fail a reconcile over it
            log.warning("event %s on %s/%s not posted: %s", reason, ns, meta.get("name"), err)
