"""The BE feedback loop's Kubernetes side against a real HTTP API server (kmock's KubernetesEmulator): BE pods
deleted only when they checkpoint, are still the lane's pod, and were not deleted within the minimum
interval; an Event for every change, hold and refusal; and the loop driven on a simulated HP latency signal
converging with its deletions spaced by the interval."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.kube import KubeClient, KubeConfig
from tessera_agent.lanes.book import LaneBook, PodLane
from tessera_agent.lanes.interference import (
    REASON_CHANGED,
    REASON_NOT_RESTARTED,
    InterferenceLoop,
    WindowedLatency,
)
from tessera_agent.lanes.restarts import KubernetesEventSink, KubernetesPodRestarter, RestartRefused
from tessera_agent.pods import NodePod

PODS = "v1/pods"
EVENTS = "v1/events"
NODE = "node-a"
U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def api(kmock: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    kmock.resources[PODS] = kmock.ResourceInfo(
        kind="Pod", namespaced=True, verbs={"list", "watch", "get", "patch", "create", "delete"}
    )
    kmock.resources[EVENTS] = kmock.ResourceInfo(
        kind="Event", namespaced=True, verbs={"create", "list", "get"}
    )
    kube = KubeClient(KubeConfig(str(kmock.url).rstrip("/")))
    yield kube
    await kube.close()


def assignment(name: str, compute: int = 100) -> Assignment:
    return Assignment(node=NODE, gpu_uuids=[U0], lane_id=name, memory_mib=2000, compute_percent=compute)


def seed(
    k: kmock.KubernetesEmulator, name: str, workload: str, *, checkpoints: bool, uid: str | None = None
) -> NodePod:
    annotations = {
        contract.ANN_ASSIGNMENT: assignment(name).to_annotation(),
        contract.ANN_WORKLOAD: workload,
        contract.ANN_ALLOCATED: f"{U0}::0",
    }
    if checkpoints:
        annotations[contract.ANN_CHECKPOINTS] = "true"
    uid = uid or f"uid-{name}"
    k.objects[PODS, "ml", name] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "annotations": annotations,
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
    }
    return NodePod(
        "ml", name, uid, "t", (1,), assignment(name), True, workload=workload, checkpoints=checkpoints
    )


def deletes(k: kmock.KubernetesEmulator) -> list[str]:
    return [str(r.name) for r in k if r.method == "DELETE" and r.resource and r.resource.plural == "pods"]


def events(k: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    return [r.data for r in k if r.method == "POST" and r.resource and r.resource.plural == "events"]


def lane_of(pod: NodePod, klass: str = "BE") -> PodLane:
    return PodLane(pod.uid, pod.key, U0, klass, 2000, 100, pod.checkpoints)  # type: ignore[arg-type]


async def test_restarter_deletes_only_checkpointing_be_pods_within_the_interval(
    kmock: kmock.KubernetesEmulator, api: KubeClient
) -> None:
    clock = Clock()
    be = seed(kmock, "be", "training:best-effort", checkpoints=True)
    plain = seed(kmock, "plain", "training:best-effort", checkpoints=False)
    hp = seed(kmock, "hp", "serving:latency-critical", checkpoints=True)
    restarter = KubernetesPodRestarter(api, min_interval_s=300, clock=clock)

    await restarter.restart(lane_of(be), "share 50% -> 25%")
    assert deletes(kmock) == ["be"]
    (delete,) = [r for r in kmock if r.method == "DELETE"]
    assert delete.data["preconditions"] == {"uid": "uid-be"}  # never a pod that replaced the lane's

    # The lane book may be stale (here it says the pod checkpoints); the API server's pod is what counts.
    stale = PodLane(plain.uid, plain.key, U0, "BE", 2000, 100, checkpoints=True)
    with pytest.raises(RestartRefused, match="checkpoints"):
        await restarter.restart(stale, "x")
    with pytest.raises(RestartRefused, match="latency-critical"):
        await restarter.restart(lane_of(hp), "x")

    # The same pod name again (its controller recreated it) within the interval: refused, no call made.
    seed(kmock, "be", "training:best-effort", checkpoints=True, uid="uid-be-2")
    clock.now += 299
    with pytest.raises(RestartRefused, match="minimum interval"):
        await restarter.restart(PodLane("uid-be-2", "ml/be", U0, "BE", 2000, 100, True), "x")
    # A lane whose pod was replaced under it: refused.
    clock.now += 2
    with pytest.raises(RestartRefused, match="replaced"):
        await restarter.restart(lane_of(be), "x")
    await restarter.restart(PodLane("uid-be-2", "ml/be", U0, "BE", 2000, 100, True), "x")
    assert deletes(kmock) == ["be", "be"] and restarter.deleted == ["ml/be", "ml/be"]


async def test_event_sink_posts_pod_events(kmock: kmock.KubernetesEmulator, api: KubeClient) -> None:
    sink = KubernetesEventSink(api, NODE)
    await sink.event("ml/be", REASON_CHANGED, "BE share 50% → 25%")
    await sink.event("ml/plain", REASON_NOT_RESTARTED, "not restarted", warning=True)
    got = events(kmock)
    assert [(e["involvedObject"]["name"], e["reason"], e["type"]) for e in got] == [
        ("be", REASON_CHANGED, "Normal"),
        ("plain", REASON_NOT_RESTARTED, "Warning"),
    ]
    assert got[0]["source"] == {"component": "tessera-agent", "host": NODE}


def hp_p99(p_be: int) -> float:
    """Simulated HP p99 (s): 10 ms alone, +0.6% per BE point past 25%; the 11.5 ms target holds at p_be ≤ 50."""
    return 0.010 * (1 + max(0, p_be - 25) * 0.006)


async def test_loop_on_kmock_converges_and_deletes_within_the_limits(
    kmock: kmock.KubernetesEmulator, api: KubeClient
) -> None:
    """The loop with the real restarter and event sink: the BE share moves from 90% to within the target,
    then stays; each deletion is of the checkpointing BE pod, none closer than the minimum interval; the
    BE pod that does not checkpoint is never deleted and gets a warning event for each change."""
    clock = Clock()
    hp = seed(kmock, "hp", "serving:latency-critical", checkpoints=False)
    be = seed(kmock, "be", "training:best-effort", checkpoints=True)
    plain = seed(kmock, "plain", "training:best-effort", checkpoints=False)
    book = LaneBook({U0: 16000}, default_be_percent=90)
    for p in (hp, be, plain):
        book.admit(p)
    latency = WindowedLatency(window_s=60, min_samples=20)
    restarter = KubernetesPodRestarter(api, min_interval_s=300, clock=clock)
    loop = InterferenceLoop(
        book,
        latency,
        restarter,
        KubernetesEventSink(api, NODE),
        node=NODE,
        p99_dedicated={U0: 0.010},
        epsilon=0.15,
        min_interval_s=300,
        hysteresis=5,
    )
    deleted_at: list[float] = []
    shares = []
    for _ in range(60):  # 60 steps of 60 s: one hour
        for _ in range(30):
            latency.record(U0, hp_p99(book.be_percent_of(U0)), clock.now)
        before = len(deletes(kmock))
        await loop.step(clock.now)
        if len(deletes(kmock)) > before:
            deleted_at.append(clock.now)
            # its controller recreates the pod (new UID) and the agent records the new lane
            new = seed(kmock, "be", "training:best-effort", checkpoints=True, uid=f"uid-be-{clock.now:.0f}")
            book.sync(p.uid for p in (hp, plain, new))
            book.admit(new)
        shares.append(book.be_percent_of(U0))
        clock.now += 60

    assert set(deletes(kmock)) == {"be"}
    assert deleted_at and all(b - a >= 300 for a, b in itertools.pairwise(deleted_at))
    final = shares[-1]
    assert hp_p99(final) <= 1.15 * 0.010 + 1e-12  # converged within the target
    assert final >= 40  # and not starved: within a hysteresis band or two of the 50% edge
    assert len(set(shares[-20:])) == 1  # no flapping in the last 20 minutes
    posted = events(kmock)
    changed = [e for e in posted if e["reason"] == REASON_CHANGED]
    warned = [e for e in posted if e["reason"] == REASON_NOT_RESTARTED]
    assert len(changed) == len(deleted_at) and all(e["involvedObject"]["name"] == "be" for e in changed)
    assert len(warned) == len(deleted_at) and all(e["involvedObject"]["name"] == "plain" for e in warned)
    assert not any(e["involvedObject"]["name"] == "hp" for e in posted)
