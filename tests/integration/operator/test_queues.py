"""Team queues on the operator against kmock: a namespace label puts an App in a Queue; a queue borrows
idle GPUs up to its maximum; a queue below its guarantee gets GPUs back at once (`immediate`) or when the
lender's lease ends (`atLeaseEnd`), with events on both sides; Queue status and tessera_queue_* gauges; a
deleted Queue's series go and its namespaces fall back to `default`."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import kmock
from tessera.api import contract

from .conftest import (
    ALL,
    APPS,
    MDS,
    TEMPLATE,
    TGS,
    ManualClock,
    add_node,
    job,
    md_body,
    running_operator,
    tg_body,
    trial,
    wait_for,
)
from .conftest import (
    pods as pods_of,
)

QUEUES = f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_QUEUE}"


async def label_namespaces(ctl: Any, *names: str) -> None:
    """What the Namespace watch does on a real API server (kmock cannot list Namespaces); then wait until
    the Queue watch has seen the queues, so that the objects the test creates next are divided by them."""
    for name in names:
        ctl.queues.set_namespace(name, {contract.LABEL_QUEUE: name})
    await wait_for(lambda: set(names) <= set(ctl.queues.specs), what="the Queues seen")


async def create_app(k: kmock.KubernetesEmulator, name: str, namespace: str, gpus: int) -> None:
    await k.post(
        f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/apps",
        json=app(name, namespace, gpus),
    )


def setup_queues(k: kmock.KubernetesEmulator, **queues: dict[str, Any]) -> None:
    k.resources[QUEUES] = kmock.ResourceInfo(
        kind="Queue", namespaced=False, verbs=ALL, subresources={"status"}
    )
    for name, spec in queues.items():
        k.objects[QUEUES, None, name] = {
            "apiVersion": contract.API_VERSION,
            "kind": "Queue",
            "metadata": {"name": name, "uid": f"uid-q-{name}", "resourceVersion": "1"},
            "spec": spec,
        }


def app(name: str, namespace: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"template": TEMPLATE, "jobs": [job("j", iters=10**9, gpus=gpus)]},
    }


def gpus(k: kmock.KubernetesEmulator, namespace: str, name: str) -> int:
    try:
        return int((dict(k.objects[APPS, namespace, name]).get("status") or {}).get("gpus") or 0)
    except KeyError:
        return 0


def queue_status(k: kmock.KubernetesEmulator, name: str) -> dict[str, Any]:
    try:
        return dict(k.objects[QUEUES, None, name]).get("status") or {}
    except KeyError:
        return {}


def events(k: kmock.KubernetesEmulator, reason: str, kind: str) -> list[dict[str, Any]]:
    return [
        dict(o)
        for _, o in list(k.objects.items())
        if dict(o).get("reason") == reason and dict(o).get("involvedObject", {}).get("kind") == kind
    ]


async def test_borrowing_stops_at_the_queues_maximum(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 6)
    setup_queues(api, **{"team-a": {"guaranteedGPUs": 2, "maxGPUs": 4}, "team-b": {"guaranteedGPUs": 2}})
    async with running_operator(api, queues=True) as ctl:
        await label_namespaces(ctl, "team-a", "team-b")
        await create_app(api, "a", "team-a", 6)
        await wait_for(lambda: ctl.queues.queue_of("team-a") == "team-a", what="the namespace label seen")
        await wait_for(lambda: gpus(api, "team-a", "a") == 4, what="A borrows up to its maximum")
        st = await wait_for(
            lambda: queue_status(api, "team-a").get("allocatedGPUs") == 4 and queue_status(api, "team-a"),
            what="queue status",
        )
        assert st["borrowedGPUs"] == 2 and st["namespaces"] == ["team-a"]
        assert ctl.metrics.gauge("tessera_queue_allocated_gpus").labels(queue="team-a")._value.get() == 4
        # Deleting the Queue: its series go and team-a's objects belong to default (whole cluster again).
        await api.delete(f"/apis/{QUEUES}/team-a")
        await wait_for(lambda: ctl.queues.queue_of("team-a") == "default", what="team-a back in default")
        assert not [
            s
            for m in ctl.metrics.gauge("tessera_queue_allocated_gpus").collect()
            for s in m.samples
            if s.labels.get("queue") == "team-a"
        ]
        await wait_for(lambda: gpus(api, "team-a", "a") == 6, what="A on the whole cluster under default")


async def _reclaim(api: kmock.KubernetesEmulator, mode: str, clock: ManualClock) -> None:
    add_node(api, "n1", 4)
    setup_queues(
        api,
        **{
            "team-a": {"guaranteedGPUs": 2, "reclaim": {"mode": mode, "checkpointGraceSeconds": 7}},
            "team-b": {"guaranteedGPUs": 2},
        },
    )


async def test_immediate_reclaim_takes_gpus_back_before_the_lease_ends(api: kmock.KubernetesEmulator) -> None:
    clock = ManualClock()
    await _reclaim(api, "immediate", clock)
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await label_namespaces(ctl, "team-a", "team-b")
        await create_app(api, "a", "team-a", 4)
        await wait_for(lambda: gpus(api, "team-a", "a") == 4, what="A borrows B's idle guarantee")
        await api.post(
            f"/apis/{APPS.replace('/apps', '')}/namespaces/team-b/apps", json=app("b", "team-b", 2)
        )
        await wait_for(lambda: gpus(api, "team-b", "b") == 2, what="B gets its guarantee back at once")
        assert gpus(api, "team-a", "a") == 2
        await wait_for(lambda: events(api, "Reclaimed", "App"), what="the event on the App that lost GPUs")
        await wait_for(lambda: events(api, "Reclaimed", "Queue"), what="the event on the Queue that gained")
        msg = events(api, "Reclaimed", "App")[0]["message"]
        assert "team-b" in msg and "below its guarantee" in msg
        # A's pods on the reclaimed GPUs go with team-a's checkpoint grace, not the operator's 5 s.
        preempted = await wait_for(lambda: events(api, "Preempted", "App"), what="A's pods deleted")
        assert "with 7s grace" in preempted[0]["message"]


async def test_at_lease_end_reclaim_waits_for_the_lease(api: kmock.KubernetesEmulator) -> None:
    clock = ManualClock()
    await _reclaim(api, "atLeaseEnd", clock)
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await label_namespaces(ctl, "team-a", "team-b")
        await create_app(api, "a", "team-a", 4)
        await wait_for(lambda: gpus(api, "team-a", "a") == 4, what="A borrows B's idle guarantee")
        await api.post(
            f"/apis/{APPS.replace('/apps', '')}/namespaces/team-b/apps", json=app("b", "team-b", 2)
        )
        await wait_for(
            lambda: (dict(api.objects[APPS, "team-b", "b"]).get("status") or {}).get("phase"),
            what="B admitted",
        )
        assert gpus(api, "team-a", "a") == 4 and gpus(api, "team-b", "b") == 0  # the lease still runs
        clock.advance(1001)
        await wait_for(lambda: gpus(api, "team-b", "b") == 2, what="B's guarantee back at lease end")
        # The round writes each App's status on its own: A's may land a moment after B's.
        await wait_for(lambda: gpus(api, "team-a", "a") == 2, what="A down to its guarantee")


async def test_trialgroup_pool_stays_within_its_queues_share(api: kmock.KubernetesEmulator) -> None:
    # team-a may hold 2 GPUs: its TrialGroup of four trials gets a pool of 2 on a 4-GPU node, and an App
    # of team-a then gets nothing more (the pool counts against the queue).
    add_node(api, "n1", 4)
    setup_queues(api, **{"team-a": {"guaranteedGPUs": 1, "maxGPUs": 2}})
    tg = tg_body("sweep", [trial(f"t{i}", 1000) for i in range(4)])
    tg["metadata"]["namespace"] = "team-a"
    async with running_operator(api, queues=True) as ctl:
        await label_namespaces(ctl, "team-a")
        await api.post(f"/apis/{TGS.replace('/trialgroups', '')}/namespaces/team-a/trialgroups", json=tg)
        ann = await wait_for(
            lambda: (dict(api.objects[TGS, "team-a", "sweep"])["metadata"].get("annotations") or {}).get(
                contract.ANN_GPU_POOL
            ),
            what="the pool",
        )
        assert len(json.loads(ann)) == 2
        await api.post(
            f"/apis/{APPS.replace('/apps', '')}/namespaces/team-a/apps", json=app("a", "team-a", 2)
        )

        def waiting() -> bool:
            conds = (dict(api.objects[APPS, "team-a", "a"]).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c.get("reason") == "WaitingForGPUs" for c in conds)

        await wait_for(waiting, what="A bidding without a lease after a round")
        assert gpus(api, "team-a", "a") == 0


async def test_serving_replicas_stay_within_the_queues_share(api: kmock.KubernetesEmulator) -> None:
    # 300 rps wants two 1-GPU replicas (test_modeldeployment.py); team-a may hold 1 GPU: one is placed.
    add_node(api, "n1", 4)
    add_node(api, "n2", 4)
    setup_queues(api, **{"team-a": {"guaranteedGPUs": 1, "maxGPUs": 1}})
    md = md_body("m", 300)
    md["metadata"]["namespace"] = "team-a"
    async with running_operator(api, queues=True) as ctl:
        await label_namespaces(ctl, "team-a")
        await wait_for(lambda: len(ctl.view.nodes) == 2, what="both nodes in the view")
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/team-a/modeldeployments", json=md
        )
        scaled = await wait_for(lambda: events_any(api, "Scaled"), what="the Scaled event")
        assert "0 → 1 replicas" in scaled[0]["message"] and "only 1 placed" in scaled[0]["message"]
        workers = pods_of(api, **{contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "worker"})
        assert len(workers) <= 1
        # The replica counts for team-a; the second one waits, the queue being at its maximum.
        st = await wait_for(
            lambda: (q := queue_status(api, "team-a")).get("pending") and q, what="team-a's pending list"
        )
        assert st["allocatedByKind"] == {"apps": 0, "trialGroups": 0, "modelDeployments": 1, "pods": 0}
        assert st["waitingByKind"] == {"apps": 0, "trialGroups": 0, "modelDeployments": 1, "pods": 0}
        (entry,) = st["pending"]
        assert (entry["kind"], entry["name"], entry["gpus"], entry["reason"]) == (
            "ModelDeployment",
            "m",
            1,
            "QueueAtMax",
        )


def events_any(k: kmock.KubernetesEmulator, reason: str) -> list[dict[str, Any]]:
    return [dict(o) for _, o in list(k.objects.items()) if dict(o).get("reason") == reason]


async def _trialgroup_waits_for_its_guarantee(
    api: kmock.KubernetesEmulator, mode: str, clock: ManualClock, ctl: Any
) -> None:
    """team-a's App borrows all four GPUs; then team-b (guaranteed 2) asks for a TrialGroup with a pool of
    2. Returns once the TrialGroup says it waits."""
    await label_namespaces(ctl, "team-a", "team-b")
    await create_app(api, "a", "team-a", 4)
    await wait_for(lambda: gpus(api, "team-a", "a") == 4, what="A borrows B's idle guarantee")
    tg = tg_body("sweep", [trial("t0", 10**6), trial("t1", 10**6)], gpus=2)
    tg["metadata"]["namespace"] = "team-b"
    await api.post(f"/apis/{TGS.replace('/trialgroups', '')}/namespaces/team-b/trialgroups", json=tg)
    await wait_for(lambda: events_any(api, "WaitingForGPUs"), what="the TrialGroup waiting for GPUs")


def pool_of(k: kmock.KubernetesEmulator, namespace: str, name: str) -> list[str]:
    ann = (dict(k.objects[TGS, namespace, name])["metadata"].get("annotations") or {}).get(
        contract.ANN_GPU_POOL
    )
    return list(json.loads(ann)) if ann else []


async def test_a_waiting_trialgroup_gets_its_queues_guarantee_back_at_once(
    api: kmock.KubernetesEmulator,
) -> None:
    # A TrialGroup is waiting work as much as an App: its queue's guarantee comes back for it.
    clock = ManualClock()
    await _reclaim(api, "immediate", clock)
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await _trialgroup_waits_for_its_guarantee(api, "immediate", clock, ctl)
        await wait_for(
            lambda: len(pool_of(api, "team-b", "sweep")) == 2, what="the pool, before A's lease ends"
        )
        assert gpus(api, "team-a", "a") == 2
        msg = (await wait_for(lambda: events(api, "Reclaimed", "App"), what="the event on A"))[0]["message"]
        assert "team-b" in msg and "below its guarantee" in msg
        # The pool and A's leases never share a GPU.
        leases = (dict(api.objects[APPS, "team-a", "a"]).get("status") or {}).get("leases") or []
        held = {f"{le['node']}/{i}" for le in leases for i in le["gpuIndices"]}
        assert not held & set(pool_of(api, "team-b", "sweep")), (held, pool_of(api, "team-b", "sweep"))


async def test_a_waiting_trialgroup_gets_its_queues_guarantee_back_at_lease_end(
    api: kmock.KubernetesEmulator,
) -> None:
    clock = ManualClock()
    await _reclaim(api, "atLeaseEnd", clock)
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await _trialgroup_waits_for_its_guarantee(api, "atLeaseEnd", clock, ctl)
        assert gpus(api, "team-a", "a") == 4 and not pool_of(api, "team-b", "sweep")  # the lease still runs

        # team-b's status lists the TrialGroup, waiting for the 2 GPUs coming back from team-a's lease.
        # (The round before the one that counts the group's wait in the division says QueueAtShare.)
        def reclaiming() -> dict[str, Any] | None:
            st = queue_status(api, "team-b")
            return st if [p["reason"] for p in st.get("pending", [])] == ["Reclaiming"] else None

        b = await wait_for(reclaiming, what="team-b's pending list: the TrialGroup, GPUs reclaimed for it")
        (entry,) = b["pending"]
        assert (entry["kind"], entry["namespace"], entry["name"], entry["gpus"]) == (
            "TrialGroup",
            "team-b",
            "sweep",
            2,
        )
        assert entry["reason"] == "Reclaiming" and "from team-a: the first atLeaseEnd at" in entry["message"]
        assert (b["waiting"], b["waitingByKind"]["trialGroups"], b["allocatedGPUs"]) == (1, 1, 0)
        a = queue_status(api, "team-a")
        assert a["allocatedByKind"] == {"apps": 4, "trialGroups": 0, "modelDeployments": 0, "pods": 0}
        pending = ctl.metrics.gauge("tessera_queue_pending")
        assert pending.labels(queue="team-b", kind="TrialGroup")._value.get() == 1
        clock.advance(1001)
        await wait_for(lambda: gpus(api, "team-a", "a") == 2, what="A down to its guarantee at lease end")
        await wait_for(lambda: len(pool_of(api, "team-b", "sweep")) == 2, what="the TrialGroup's pool")
        # The pool counts for team-b (by kind), and nothing of it waits any more.
        b = await wait_for(
            lambda: (st := queue_status(api, "team-b")).get("allocatedGPUs") == 2 and st,
            what="the pool in team-b's status",
        )
        assert b["allocatedByKind"]["trialGroups"] == 2 and b["waiting"] == 0 and b["pending"] == []
        kind_gpus = ctl.metrics.gauge("tessera_queue_kind_allocated_gpus")
        assert kind_gpus.labels(queue="team-b", kind="TrialGroup")._value.get() == 2
        # The GPUs A gave up stay for the TrialGroup: later rounds do not hand them back to A.
        clock.advance(1001)
        await wait_for(
            lambda: ctl.arbiter is not None and ctl.arbiter.rounds >= 3 and not ctl.arbiter.dirty,
            what="a round",
        )
        assert gpus(api, "team-a", "a") == 2


async def test_serving_replicas_waiting_within_the_share_get_the_guarantee_back(
    api: kmock.KubernetesEmulator,
) -> None:
    # 300 rps wants two 1-GPU replicas; team-a's App holds all 4 GPUs, 2 of them borrowed from team-b.
    clock = ManualClock()
    await _reclaim(api, "immediate", clock)
    md = md_body("m", 300)
    md["metadata"]["namespace"] = "team-b"
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await label_namespaces(ctl, "team-a", "team-b")
        await create_app(api, "a", "team-a", 4)
        await wait_for(lambda: gpus(api, "team-a", "a") == 4, what="A borrows B's idle guarantee")
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/team-b/modeldeployments", json=md
        )
        await wait_for(
            lambda: (
                len(pods_of(api, **{contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "worker"})) == 2
            ),
            what="both replicas placed on GPUs taken back from A",
        )
        assert gpus(api, "team-a", "a") == 2


async def _borrowing_trialgroup(api: kmock.KubernetesEmulator, ctl: Any) -> None:
    """team-a's TrialGroup of four trials takes all four GPUs (team-b's guarantee idle); then team-b's
    App asks for its guarantee of 2."""
    await label_namespaces(ctl, "team-a", "team-b")
    tg = tg_body("sweep", [trial(f"t{i}", 10**6) for i in range(4)])
    tg["metadata"]["namespace"] = "team-a"
    await api.post(f"/apis/{TGS.replace('/trialgroups', '')}/namespaces/team-a/trialgroups", json=tg)
    await wait_for(lambda: len(pool_of(api, "team-a", "sweep")) == 4, what="the pool borrowing B's guarantee")
    await api.post(f"/apis/{APPS.replace('/apps', '')}/namespaces/team-b/apps", json=app("b", "team-b", 2))


async def test_a_trialgroup_pool_above_its_queues_share_gives_gpus_back_at_once(
    api: kmock.KubernetesEmulator,
) -> None:
    clock = ManualClock()
    await _reclaim(api, "immediate", clock)
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await _borrowing_trialgroup(api, ctl)
        await wait_for(lambda: gpus(api, "team-b", "b") == 2, what="B's guarantee back from the pool")
        # The group's annotation is written when its pass ends, which may be after B's round.
        await wait_for(lambda: len(pool_of(api, "team-a", "sweep")) == 2, what="the pool down to 2")
        msg = events(api, "Reclaimed", "TrialGroup")[0]["message"]
        assert "given back to queue team-b" in msg and "below its guarantee" in msg
        await wait_for(lambda: events(api, "Reclaimed", "Queue"), what="the event on the Queue that gained")
        # Fluid re-planned the four trials on the two GPUs left.
        await wait_for(
            lambda: (
                {
                    json.loads(p["metadata"]["annotations"][contract.ANN_PLACEMENT])["gpuIndices"][0]
                    for p in pods_of(api, **{contract.LABEL_TRIALGROUP: "sweep"}).values()
                }
                <= {int(g.rsplit("/", 1)[1]) for g in pool_of(api, "team-a", "sweep")}
            ),
            what="the trials' pods on the pool that is left",
        )


async def test_a_trialgroup_pool_above_its_queues_share_gives_gpus_back_at_its_next_replan(
    api: kmock.KubernetesEmulator,
) -> None:
    clock = ManualClock()
    await _reclaim(api, "atLeaseEnd", clock)
    async with running_operator(api, lease_s=1000.0, clock=clock, queues=True) as ctl:
        await _borrowing_trialgroup(api, ctl)
        await wait_for(
            lambda: (dict(api.objects[APPS, "team-b", "b"]).get("status") or {}).get("phase"),
            what="B admitted",
        )
        assert ctl.arbiter is not None
        await wait_for(
            lambda: (
                ctl.arbiter is not None
                and any(o.startswith("TrialGroup/") for o in ctl.arbiter.outside_reclaims)
            ),
            what="the round asking the pool for GPUs",
        )
        assert (
            len(pool_of(api, "team-a", "sweep")) == 4 and gpus(api, "team-b", "b") == 0
        )  # no trial ended yet
        # A trial ends: the group re-plans, and gives the GPUs back then.
        (pod, *_) = [
            p
            for p in pods_of(api, **{contract.LABEL_TRIALGROUP: "sweep"}).values()
            if p["metadata"]["labels"][contract.LABEL_TRIAL] == "t0"
        ]
        await api.patch(
            f"/api/v1/namespaces/team-a/pods/{pod['metadata']['name']}",
            json={"status": {"phase": "Succeeded"}},
        )
        await wait_for(lambda: gpus(api, "team-b", "b") == 2, what="B's guarantee back at the re-plan")
        await wait_for(lambda: len(pool_of(api, "team-a", "sweep")) == 2, what="the pool down to 2")


async def test_serving_replicas_above_their_queues_share_are_given_back(
    api: kmock.KubernetesEmulator,
) -> None:
    # 300 rps wants two 1-GPU replicas; team-a is guaranteed 1, so its second replica borrows. team-b
    # (guaranteed 3) then asks for 3 GPUs: 2 are free, the borrowed replica is given back for the third.
    add_node(api, "n1", 4)
    setup_queues(api, **{"team-a": {"guaranteedGPUs": 1}, "team-b": {"guaranteedGPUs": 3}})
    md = md_body("m", 300)
    md["metadata"]["namespace"] = "team-a"
    workers = {contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "worker"}
    async with running_operator(api, lease_s=1000.0, clock=ManualClock(), queues=True) as ctl:
        await label_namespaces(ctl, "team-a", "team-b")
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/team-a/modeldeployments", json=md
        )
        await wait_for(lambda: len(pods_of(api, **workers)) == 2, what="two replicas, one borrowed")
        await api.post(
            f"/apis/{APPS.replace('/apps', '')}/namespaces/team-b/apps", json=app("b", "team-b", 3)
        )
        await wait_for(lambda: gpus(api, "team-b", "b") == 3, what="B's guarantee, one GPU from a replica")
        await wait_for(lambda: len(pods_of(api, **workers)) == 1, what="the borrowed replica's pod deleted")
        msg = (await wait_for(lambda: events(api, "Reclaimed", "ModelDeployment"), what="the event"))[0][
            "message"
        ]
        assert "1 replica(s)" in msg and "team-b" in msg
        # The deployment still wants two replicas, but does not take the GPU back.
        assert ctl.deployments is not None and len(ctl.deployments.records["team-a", "m"].gpus) == 1


def condition_of(
    k: kmock.KubernetesEmulator, resource: str, namespace: str, name: str
) -> dict[str, Any] | None:
    """The object's QueueResolved condition (None: it has none)."""
    try:
        conds = (dict(k.objects[resource, namespace, name]).get("status") or {}).get("conditions") or []
    except KeyError:
        return None
    return next((c for c in conds if c.get("type") == "QueueResolved"), None)


def queue_events(k: kmock.KubernetesEmulator, reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in events_any(k, reason) if e["involvedObject"]["name"] == name]


async def test_a_namespace_naming_a_missing_queue_is_reported_on_its_objects(
    api: kmock.KubernetesEmulator,
) -> None:
    """The defect: a namespace labelled with a queue that does not exist went to `default` with no event or
    condition. Its App, TrialGroup and ModelDeployment now say so (QueueResolved=False, QueueNotFound, one
    Warning event each however many rounds and passes run), turn True once the Queue is created, and drop
    the condition once the label goes."""
    add_node(api, "n1", 8)
    setup_queues(api, **{"team-a": {"guaranteedGPUs": 2}})
    ns = "ghost-team"
    tg = tg_body("sweep", [trial("t0", 10**6)], gpus=1)
    md = md_body("m", 100)
    for body in (tg, md):
        body["metadata"]["namespace"] = ns
    objects = [(APPS, "a"), (TGS, "sweep"), (MDS, "m")]
    group = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}"
    async with running_operator(api, queues=True) as ctl:
        await label_namespaces(ctl, "team-a")
        await wait_for(lambda: ctl.arbiter and ctl.trialgroups and ctl.deployments, what="the login")
        arbiter, trialgroups, deployments = ctl.arbiter, ctl.trialgroups, ctl.deployments
        assert arbiter is not None and trialgroups is not None and deployments is not None
        ctl.queues.set_namespace(ns, {contract.LABEL_QUEUE: "ghost"})
        await create_app(api, "a", ns, 1)
        await api.post(f"{group}/trialgroups", json=tg)
        await api.post(f"{group}/modeldeployments", json=md)

        def news(reason: str, name: str, count: int) -> list[dict[str, Any]]:
            got = queue_events(api, reason, name)
            return got if len(got) == count else []

        def reported(status: str, reason: str | None = None) -> bool:
            got = [condition_of(api, res, ns, name) for res, name in objects]
            return all(
                c is not None and c["status"] == status and (reason is None or c["reason"] == reason)
                for c in got
            )

        await wait_for(lambda: reported("False", "QueueNotFound"), what="QueueResolved=False on all three")
        msg = (condition_of(api, APPS, ns, "a") or {})["message"]
        assert "ghost" in msg and "default" in msg and contract.LABEL_QUEUE in msg, msg
        for _, name in objects:
            await wait_for(partial(queue_events, api, "QueueNotFound", name), what=f"the event on {name}")
        # More rounds and passes: no repeated event, and no App status write (nothing changed).
        rounds, passes = arbiter.rounds, (trialgroups.reconciles, deployments.reconciles)
        writes = arbiter.status_writes
        for _ in range(3):
            arbiter.dirty = True
            await wait_for(lambda: not arbiter.dirty, what="a round")
        await wait_for(
            lambda: (
                arbiter.rounds >= rounds + 3
                and trialgroups.reconciles >= passes[0] + 3
                and deployments.reconciles >= passes[1] + 3
            ),
            what="more rounds and passes",
        )
        for _, name in objects:
            got = queue_events(api, "QueueNotFound", name)
            assert len(got) == 1 and got[0]["type"] == "Warning", got
        assert arbiter.status_writes == writes
        # The Queue created: True without a restart.
        await api.post(
            f"/apis/{QUEUES}",
            json={
                "apiVersion": contract.API_VERSION,
                "kind": "Queue",
                "metadata": {"name": "ghost"},
                "spec": {},
            },
        )
        await wait_for(lambda: reported("True", "QueueFound"), what="QueueResolved=True on all three")
        assert ctl.queues.queue_of(ns) == "ghost"
        for _, name in objects:
            got = await wait_for(partial(queue_events, api, "QueueResolved", name), what=f"{name}'s news")
            assert len(got) == 1 and got[0]["type"] == "Normal" and "in queue ghost" in got[0]["message"]
        # Relabelled to another missing queue: False again (a new event); the label removed: no condition.
        ctl.queues.set_namespace(ns, {contract.LABEL_QUEUE: "phantom"})
        arbiter.dirty = True
        await wait_for(lambda: reported("False", "QueueNotFound"), what="QueueResolved=False again")
        for _, name in objects:
            await wait_for(partial(news, "QueueNotFound", name, 2), what=f"the second event on {name}")
        ctl.queues.set_namespace(ns, {})
        arbiter.dirty = True
        await wait_for(
            lambda: all(condition_of(api, res, ns, name) is None for res, name in objects),
            what="no QueueResolved condition without the label",
        )
        for _, name in objects:
            got = await wait_for(partial(news, "QueueResolved", name, 2), what=f"{name}'s label news")
            assert any("no longer names a queue" in e["message"] for e in got), got


async def test_a_parents_status_counts_its_subtree(api: kmock.KubernetesEmulator) -> None:
    # org (guaranteed 4) holds team-a and team-b; 6 GPUs, no other demand: org's subtree gets all 6
    # (a 5, b 1) and a's App waits for 2 more. The parent's status is its subtree's; `own` its own objects'.
    add_node(api, "n1", 6)
    setup_queues(
        api,
        org={"guaranteedGPUs": 4},
        **{
            "team-a": {"parent": "org", "guaranteedGPUs": 2},
            "team-b": {"parent": "org", "guaranteedGPUs": 2},
            "other": {"guaranteedGPUs": 2},
        },
    )
    async with running_operator(api, queues=True) as ctl:
        await label_namespaces(ctl, "team-a", "team-b", "org", "other")
        await create_app(api, "a", "team-a", 7)
        await create_app(api, "b", "team-b", 1)
        await wait_for(lambda: gpus(api, "team-a", "a") == 5 and gpus(api, "team-b", "b") == 1, what="grants")
        org = await wait_for(
            lambda: (s := queue_status(api, "org")).get("allocatedGPUs") == 6 and s, what="org's status"
        )
        assert (org["shareGPUs"], org["borrowedGPUs"], org["lentGPUs"]) == (6, 2, 0)
        assert org["allocatedByKind"]["apps"] == 6 and org["waiting"] == 1
        assert [(p["queue"], p["name"], p["gpus"]) for p in org["pending"]] == [("team-a", "a", 2)]
        assert org["own"] == {"shareGPUs": 0, "allocatedGPUs": 0, "waiting": 0}
        # Each Queue's status is a patch of its own: team-a's may land after org's.
        a = await wait_for(
            lambda: (s := queue_status(api, "team-a")).get("allocatedGPUs") == 5 and s, what="team-a's status"
        )
        assert (a["allocatedGPUs"], a["shareGPUs"], a["borrowedGPUs"], a["waiting"]) == (5, 5, 3, 1)
        assert "own" not in a  # a leaf: its own objects are its subtree
        assert ctl.metrics.gauge("tessera_queue_allocated_gpus").labels(queue="org")._value.get() == 6


async def test_a_queues_status_is_cleared_when_its_last_app_goes(api: kmock.KubernetesEmulator) -> None:
    # No App (nor TrialGroup, ModelDeployment) is left whose timer would run a round: the deletion must.
    add_node(api, "n1", 4)
    setup_queues(api, **{"team-a": {"guaranteedGPUs": 2}})
    clock = ManualClock()
    async with running_operator(api, queues=True, clock=clock) as ctl:
        await label_namespaces(ctl, "team-a")
        await create_app(api, "a", "team-a", 6)
        st = await wait_for(
            lambda: (
                (s := queue_status(api, "team-a")).get("allocatedGPUs") == 4 and s.get("waiting") == 1 and s
            ),
            what="team-a's status with its App",
        )
        assert st["pending"] and st["borrowedGPUs"] == 2
        for _ in range(50):  # rounds until the App has a ρ (it needs GPU-seconds)
            if "maxRho" in queue_status(api, "team-a"):
                break
            clock.advance(2.0)
            await ctl.need(ctl.arbiter).maybe_run()
        assert "maxRho" in queue_status(api, "team-a")
        await api.delete(f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/team-a/apps/a")
        st = await wait_for(
            lambda: (s := queue_status(api, "team-a")).get("allocatedGPUs") == 0 and s,
            what="team-a's status without its App",
        )
        assert (st["borrowedGPUs"], st["waiting"], st["pending"], st["lentGPUs"]) == (0, 0, [], 2)
        assert "maxRho" not in st
