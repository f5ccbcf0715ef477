"""Two operator replicas with kopf peering (issue 8): only the highest-priority live peer
allocates; the next one takes over when the active peer stops (kopf clears its peering record on exit) or
when a peer that died without clearing it outlives its lifetime. Against kmock; every request is attributed
to the operator that sent it by its bearer token, and each controller's own client records its calls."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
from tessera.api import contract
from tessera.controller.handlers import Controller

from .conftest import APPS, NS, add_node, app_body, job, pods, running_operator, status_of, wait_for

CLUSTER_PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
HIGH, LOW = "tessera-high", "tessera-low"
PEERED = {"standalone": False, "peering_name": "default"}


@contextlib.asynccontextmanager
async def replica(k: kmock.KubernetesEmulator, **kwargs: Any) -> AsyncIterator[Controller]:
    """One operator replica on its own thread and event loop, as in its own pod. In one loop, stopping a
    kopf operator cancels every task created after it started, the other replica's included (kopf
    running.py, "hung tasks"), so a replica could not be stopped alone."""
    ready, stop = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with running_operator(k, **kwargs) as ctl:
            box["ctl"] = ctl
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as err:  # surfaced to the test below
            box["error"] = err
        finally:
            ready.set()

    thread = threading.Thread(target=main, name=f"operator-{kwargs.get('identity')}", daemon=True)
    thread.start()
    await asyncio.to_thread(ready.wait, 60)
    try:
        if "error" in box:
            raise box["error"]
        yield box["ctl"]
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive(), "the operator replica did not stop within 30 s"
    if "error" in box:
        raise box["error"]


def calls_of(ctl: Controller) -> set[tuple[str, str, str]]:
    """A copy of the controller's recorded calls; its own thread may add to the set while we copy."""
    while True:
        try:
            return set(ctl.api.calls) if ctl.api is not None else set()
        except RuntimeError:  # "Set changed size during iteration": copy again
            continue


def seed_peering(k: kmock.KubernetesEmulator, status: dict[str, dict[str, object]] | None = None) -> None:
    # The operators run clusterwide, so kopf peers through the ClusterKopfPeering named `default`.
    k.resources[CLUSTER_PEERINGS] = kmock.ResourceInfo(
        kind="ClusterKopfPeering", namespaced=False, verbs={"list", "watch", "get", "patch"}
    )
    body: dict[str, object] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "default", "uid": "uid-peering", "resourceVersion": "1"},
    }
    if status is not None:
        body["status"] = status
    k.objects[CLUSTER_PEERINGS, None, "default"] = body


def peers(k: kmock.KubernetesEmulator) -> dict[str, dict[str, object]]:
    return dict(dict(k.objects[CLUSTER_PEERINGS, None, "default"]).get("status") or {})


def writes_by(k: kmock.KubernetesEmulator, token: str) -> set[tuple[str, str, str]]:
    """(plural, name, method) of every write sent with this bearer token, the peering keep-alives excluded."""
    out = set()
    for r in list(k):
        if r.method == "GET" or r.resource is None or r.resource.plural == "clusterkopfpeerings":
            continue
        if r.headers.get("Authorization") == f"Bearer {token}":
            out.add((r.resource.plural, r.name or "", r.method.value))
    return out


def allocated(k: kmock.KubernetesEmulator, name: str) -> bool:
    return bool(pods(k, **{contract.LABEL_APP: name})) and bool(status_of(k, APPS, name).get("leases"))


async def post_app(k: kmock.KubernetesEmulator, name: str) -> None:
    await k.post(
        f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/apps", json=app_body(name, [job("j1")])
    )


async def test_only_the_high_priority_peer_allocates_and_the_low_one_takes_over_on_stop(
    api: kmock.KubernetesEmulator,
) -> None:
    seed_peering(api)
    add_node(api, "n1", 2)
    high_run: contextlib.AbstractAsyncContextManager[Controller] | None = replica(
        api, identity=HIGH, token=HIGH, priority=100, **PEERED
    )
    assert high_run is not None
    high = await high_run.__aenter__()
    try:
        # The high peer announces itself before the low one starts: kopf pauses a peer only once it has
        # seen a higher-priority record, so this is the order in which "only the active one" is guaranteed.
        await wait_for(lambda: HIGH in peers(api), what="the high peer's keep-alive")
        async with replica(api, identity=LOW, token=LOW, priority=10, **PEERED) as low:
            await wait_for(lambda: LOW in peers(api), what="the low peer's keep-alive")
            assert peers(api)[HIGH]["priority"] == 100 and peers(api)[LOW]["priority"] == 10
            await post_app(api, "a")
            await wait_for(lambda: allocated(api, "a"), what="App a allocated")
            assert ("", "pods", "create") in calls_of(high)
            assert {("pods", "POST"), ("apps", "PATCH")} <= {(p, m) for p, _, m in writes_by(api, HIGH)}
            # The paused peer wrote nothing: neither its own client (pods, App status, events) nor kopf on
            # its behalf (finalizers, handler status).
            assert calls_of(low) == set()
            assert writes_by(api, LOW) == set()

            await high_run.__aexit__(None, None, None)
            high_run = None
            assert HIGH not in peers(api)  # a clean stop removes the record (lifetime 0): no wait for expiry

            await post_app(api, "b")
            await wait_for(lambda: allocated(api, "b"), what="App b allocated by the low peer")
            assert ("", "pods", "create") in calls_of(low)
            low_writes = writes_by(api, LOW)
            assert ("pods", "POST") in {(p, m) for p, _, m in low_writes}
            assert ("apps", "b", "PATCH") in low_writes
            assert not any(name == "b" for _, name, _ in writes_by(api, HIGH))
            # The low peer adopted a's lease from its status instead of allocating a again.
            assert len(pods(api, **{contract.LABEL_APP: "a"})) == 1
    finally:
        if high_run is not None:
            await high_run.__aexit__(None, None, None)


async def test_a_dead_peers_record_blocks_allocation_until_its_lifetime_ends(
    api: kmock.KubernetesEmulator,
) -> None:
    # A priority-100 replica that died without clearing its record (a hard kill): kopf keeps the
    # priority-10 one paused until lastseen + lifetime, then removes the record and resumes.
    lifetime = 6
    lastseen = datetime.datetime.now(datetime.UTC)
    deadline = time.monotonic() + lifetime
    seed_peering(api, {"crashed": {"priority": 100, "lifetime": lifetime, "lastseen": lastseen.isoformat()}})
    add_node(api, "n1", 1)
    async with replica(api, identity=LOW, token=LOW, priority=10, **PEERED) as low:
        await wait_for(lambda: LOW in peers(api), what="the low peer's keep-alive")
        await post_app(api, "a")
        # Until the dead peer's record expires the low peer must not act; check that for as long as the
        # record is live (with a margin for the clocks' skew), then that it takes over after the expiry.
        while time.monotonic() < deadline - 1.0:
            assert writes_by(api, LOW) == set() and not pods(api), "a paused peer allocated"
            await asyncio.sleep(0.1)
        await wait_for(lambda: allocated(api, "a"), what="App a allocated after the dead peer's lifetime")
        assert time.monotonic() >= deadline - 1.0
        assert ("", "pods", "create") in calls_of(low)
        assert "crashed" not in peers(api)  # kopf cleaned the expired record
