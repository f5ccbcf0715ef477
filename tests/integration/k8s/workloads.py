"""What the real-cluster workload tests (test_app, test_trialgroup, test_modeldeployment) share: API calls
off the event loop, the kubelet's part for deleted pods, and an operator that releases the test's objects
before it stops (their finalizers are its own; left behind, the next test's operator would find them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from tessera.api import contract
from tessera.controller.handlers import Controller

from .conftest import Credentials, running_operator, wait_for
from .controlplane import ControlPlane

G, V = contract.GROUP, contract.VERSION
PLURALS = (contract.PLURAL_APP, contract.PLURAL_TRIALGROUP, contract.PLURAL_MODELDEPLOYMENT)


async def call(cluster: ControlPlane, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    """One admin API call off the event loop (the operator under test shares the loop); must succeed."""
    status, out = await asyncio.to_thread(cluster.request, method, path, body, **kw)
    assert status < 300, f"{method} {path}: {status} {json.dumps(out)[:500]}"
    return out


def cr_path(plural: str, ns: str, name: str = "", sub: str = "") -> str:
    return (
        f"/apis/{G}/{V}/namespaces/{ns}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")
    )


def status_of(cluster: ControlPlane, plural: str, ns: str, name: str) -> dict[str, Any]:
    return dict((cluster.get(cr_path(plural, ns, name)) or {}).get("status") or {})


def modeldeployment(name: str, rps: float) -> dict[str, Any]:
    """A static model with a measured ℓ(b), a 100 ms SLO and 4096 MiB / 50 % lanes: one replica serves
    up to ~178 rps."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_MODELDEPLOYMENT,
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}},
            "model": {"name": "resnet", "dynamic": False},
            "slo": {"latencyMs": 100},
            "traffic": {"expectedRps": rps},
            "batching": {
                "supportedBatchSizes": [1, 2, 4, 8],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15, 25, 45]},
            },
            "gpu": {"lane": {"memoryMiB": 4096, "computePercent": 50}},
        },
    }


def pods_with(
    cluster: ControlPlane, ns: str, label: str, value: str, *, live: bool = True
) -> list[dict[str, Any]]:
    """Pods carrying label=value as the API server lists them; `live` leaves out pods being deleted."""
    got = cluster.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={label}%3D{value}") or {}
    items: list[dict[str, Any]] = got.get("items") or []
    return [p for p in items if not (live and p["metadata"].get("deletionTimestamp"))]


def bound(pods: list[dict[str, Any]]) -> bool:
    """Every pod bound by kube-scheduler with the extender's lane assignment written."""
    return all(
        p["spec"].get("nodeName") and contract.ANN_ASSIGNMENT in (p["metadata"].get("annotations") or {})
        for p in pods
    )


def placement_of(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(pod["metadata"]["annotations"][contract.ANN_PLACEMENT]))


def assignment_of(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT]))


def events(cluster: ControlPlane, ns: str, reason: str) -> list[dict[str, Any]]:
    got = cluster.get(f"/api/v1/namespaces/{ns}/events?fieldSelector=reason%3D{reason}") or {}
    return list(got.get("items") or [])


def scheduling_report(cluster: ControlPlane, *namespaces: str, scheduling: Any = None) -> str:
    """For a failed wait on pods being bound: each pod's node, PodScheduled condition and Tessera
    annotations, the FailedScheduling events with their times and counts, and the end of the extender's
    and kube-scheduler's logs when `scheduling` (the fixture) is given."""
    lines = []
    for ns in namespaces:
        for p in (cluster.get(f"/api/v1/namespaces/{ns}/pods") or {}).get("items") or []:
            meta = p["metadata"]
            cond = next(
                (c for c in p.get("status", {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
                {},
            )
            ann = {
                k.removeprefix(f"{contract.GROUP}/"): v[:160]
                for k, v in (meta.get("annotations") or {}).items()
                if contract.GROUP in k
            }
            lines.append(
                f"{ns}/{meta['name']}: node {p['spec'].get('nodeName')!r}, phase {p['status'].get('phase')}, "
                f"deleting {bool(meta.get('deletionTimestamp'))}, PodScheduled {cond.get('status')} "
                f"{cond.get('reason', '')} {cond.get('message', '')[:300]!r} at {cond.get('lastTransitionTime')}, "
                f"annotations {ann}"
            )
        for e in events(cluster, ns, "FailedScheduling"):
            lines.append(
                f"  FailedScheduling {e['involvedObject'].get('name')} x{e.get('count')} "
                f"{e.get('firstTimestamp') or e.get('eventTime')}..{e.get('lastTimestamp')}: "
                f"{e.get('message', '')[:300]}"
            )
    if scheduling is not None:
        for proc in (scheduling.extender, scheduling.scheduler):
            lines.append(f"{proc.name} log's end:")
            lines += ["  " + line[:300] for line in proc.tail(25).splitlines()]
    return "\n".join(lines)


class Kubelet:
    """The kubelet's part for deleted pods: a pod with a deletionTimestamp has stopped, so it is removed
    (grace 0), as the kubelet does once its containers exit. Records the grace each pod was deleted with."""

    def __init__(self, cluster: ControlPlane, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.grace: dict[str, int | None] = {}  # pod name → deletionGracePeriodSeconds it was deleted with

    def sweep(self) -> None:
        got = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/pods") or {}
        for pod in got.get("items") or []:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                self.grace.setdefault(meta["name"], meta.get("deletionGracePeriodSeconds"))
                self.cluster.request(
                    "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}?gracePeriodSeconds=0"
                )

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.sweep)
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def kubelet(cluster: ControlPlane, namespace: str) -> AsyncIterator[Kubelet]:
    k = Kubelet(cluster, namespace)
    task = asyncio.create_task(k.run())
    try:
        yield k
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def release(cluster: ControlPlane, namespace: str) -> None:
    """Delete the namespace's Tessera objects and wait until the operator's finalizers let them go."""
    for plural in PLURALS:
        await call(cluster, "DELETE", cr_path(plural, namespace))

    def gone() -> bool:
        return all(not (cluster.get(cr_path(p, namespace)) or {"items": [1]})["items"] for p in PLURALS)

    await wait_for(gone, 60, f"the Tessera objects of {namespace} to be deleted")


@contextlib.asynccontextmanager
async def operator(
    cluster: ControlPlane, creds: Credentials, namespace: str, **overrides: Any
) -> AsyncIterator[Controller]:
    """`running_operator` that, before it stops, deletes the test's objects and waits for them to go."""
    async with running_operator(cluster, creds, **overrides) as ctl:
        try:
            yield ctl
        except BaseException:
            with contextlib.suppress(Exception):
                await release(cluster, namespace)
            raise
        await release(cluster, namespace)
