"""The operator's own Kubernetes calls: create/delete pods and children, patch status of other objects.

kopf owns watching and the patches of the object a handler runs for; everything else the controller does
(pods of an App, status of Apps an arbiter round touched, gateway Deployments) goes through this small
aiohttp client, built from the same credentials kopf logged in with. Every call is recorded as
(api group, resource, verb) so tests can check them against the RBAC rules in `rbac.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import ssl
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]


class KubeError(RuntimeError):
    """An API call failed; `status` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Kind:
    """Where a resource lives in the API: group ('' for core), version, plural."""

    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"
        out = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{self.plural}"
        if name:
            out += f"/{name}"
        if sub:
            out += f"/{sub}"
        return out


PODS = Kind("", "v1", "pods")
SERVICES = Kind("", "v1", "services")
CONFIGMAPS = Kind("", "v1", "configmaps")
DEPLOYMENTS = Kind("apps", "v1", "deployments")
EVENTS = Kind("", "v1", "events")


def _ssl_context(conn: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if conn.insecure:
        return False
    if not (conn.ca_path or conn.ca_data or conn.certificate_path or conn.certificate_data):
        return True
    ctx = ssl.create_default_context(
        cafile=str(conn.ca_path) if conn.ca_path else None,
        cadata=conn.ca_data.decode() if isinstance(conn.ca_data, bytes) else conn.ca_data,
    )
    if conn.certificate_path and conn.private_key_path:
        ctx.load_cert_chain(str(conn.certificate_path), str(conn.private_key_path))
    return ctx


@dataclass
class KubeApi:
    """Typed calls over one aiohttp session; `calls` records (group, plural[/sub], verb) for RBAC checks
    and `counts` how many requests each of those made (the benchmark's API calls per round). `seconds`
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
    _session: aiohttp.ClientSession | None = None
    # Built once: aiohttp pools connections per SSL context object, so a context made per request never
    # reused a connection and paid a TLS handshake (and a CA file read) on every call.
    _ssl: ssl.SSLContext | bool | None = None
    # Events are best effort and come in bursts (hundreds in a 1000-App round). Unbounded, they filled the
    # session's connection pool and the round's pod and status writes queued behind them.
    events_in_flight: int = 4
    _event_gate: asyncio.Semaphore | None = None

    def busy_seconds(self) -> float:
        """`busy_s` with the stretch of requests in flight right now included."""
        return self.busy_s + (time.perf_counter() - self._busy_since if self._in_flight else 0.0)

    def _headers(self) -> dict[str, str]:
        if self.conn.token:
            return {"Authorization": f"{self.conn.scheme or 'Bearer'} {self.conn.token}"}
        return {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
    ) -> JsonObj:
        call = (kind.group, kind.plural + (f"/{sub}" if sub else ""), verb)
        self.calls.add(call)
        self.counts[call] += 1
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers())
        if self._ssl is None:
            self._ssl = _ssl_context(self.conn)
        data = None if body is None else json.dumps(body)
        t0 = time.perf_counter()
        if not self._in_flight:
            self._busy_since = t0
        self._in_flight += 1
        try:
            async with self._session.request(
                method,
                self.conn.server.rstrip("/") + path,
                data=data,
                headers={"Content-Type": content_type},
                ssl=self._ssl,
            ) as resp:
                text = await resp.text()
                if resp.status >= 300:
                    raise KubeError(f"{method} {path}: HTTP {resp.status}: {text[:300]}", resp.status)
                result: JsonObj = json.loads(text) if text else {}
                return result
        except aiohttp.ClientError as err:
            raise KubeError(f"{method} {path}: {err}") from err
        finally:
            t1 = time.perf_counter()
            self.seconds[call] += t1 - t0
            self._in_flight -= 1
            if not self._in_flight:
                self.busy_s += t1 - self._busy_since

    async def create(self, kind: Kind, namespace: str, obj: JsonObj) -> JsonObj:
        """Create; an object of that name already there counts as done (409), so reconciles repeat safely."""
        try:
            return await self._call("create", kind, "POST", kind.path(namespace), body=obj)
        except KubeError as err:
            if err.status == 409:
                return obj
            raise

    async def delete(
        self, kind: Kind, namespace: str, name: str, *, grace_seconds: int | None = None
    ) -> None:
        """Delete; already gone (404) counts as done. `grace_seconds` is the pod's SIGTERM→SIGKILL window."""
        body = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else None
        path = kind.path(namespace, name)
        if grace_seconds is not None:
            path += f"?gracePeriodSeconds={grace_seconds}"
        try:
            await self._call("delete", kind, "DELETE", path, body=body)
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
                "namespace": ns,
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
