"""App: pods with placements and a filled status; lease expiry moves GPUs to the worse ρ; finalizer cleanup;
invalid objects; restart recovery. All against kmock, asserting on what reached the API."""

from __future__ import annotations

import json

import kmock
from tessera.api import contract

from .conftest import (
    APPS,
    NS,
    PODS,
    ManualClock,
    add_node,
    app_body,
    job,
    plain_gpu_pod,
    pods,
    running_operator,
    wait_for,
)


def status(k: kmock.KubernetesEmulator, name: str) -> dict:
    return dict(k.objects[APPS, NS, name]).get("status") or {}


def events(k: kmock.KubernetesEmulator, reason: str) -> list[dict]:
    return [dict(o) for _, o in list(k.objects.items()) if dict(o).get("reason") == reason]


async def test_app_gets_pods_with_placements_and_status(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=2), job("j2", gpus=1)])
    async with running_operator(api):
        got = await wait_for(
            lambda: len(pods(api, **{contract.LABEL_APP: "a"})) == 2 and pods(api), what="pods"
        )
        st = await wait_for(lambda: status(api, "a").get("leases") and status(api, "a"), what="status")
    assert st["phase"] == "Running" and st["gpus"] == 3 and st["rho"] > 0
    assert {j["name"]: j["gpus"] for j in st["jobs"]} == {"j1": 2, "j2": 1}
    used = set()
    for body in got.values():
        meta, spec = body["metadata"], body["spec"]
        assert spec["schedulerName"] == contract.SCHEDULER_NAME
        placement = json.loads(meta["annotations"][contract.ANN_PLACEMENT])
        assert placement["node"] == "n1"
        used.update(placement["gpuIndices"])
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env[contract.ENV_RANK] == "0" and env[contract.ENV_WORLD_SIZE] == "1"
        jobname = meta["labels"][contract.LABEL_JOB]
        assert env[contract.ENV_JOB] == jobname
        assert spec["containers"][0]["resources"]["limits"][contract.RESOURCE_GPU] == str(
            len(placement["gpuIndices"])
        )
        assert meta["ownerReferences"][0]["uid"] == "uid-a"
        assert meta["annotations"][contract.ANN_WORKLOAD].startswith("training")
    assert len(used) == 3


async def test_lease_expiry_moves_gpus_to_worse_rho(api: kmock.KubernetesEmulator) -> None:
    # n2/0 starts out held by a plain GPU pod, so A leases n1/0 first and n2/0 in a later round (when that
    # pod goes): A's two leases expire at different times and A never drops to holding nothing. The test
    # owns the clock, so the n1 lease expires exactly when it advances time past it, however slow the
    # machine is. f = 0: both apps bid, so the auction — which values B's empty holding at ρ_cap — decides.
    # (With f = 0.8 only the higher-ranked of two apps bids, and under `starving_rank: fair_share` a
    # newcomer that can still finish within its T_id ranks below A, which has shared since it arrived.)
    clock = ManualClock()
    add_node(api, "n1", 1)
    add_node(api, "n2", 1)
    api.objects[PODS, NS, "other"] = plain_gpu_pod("other", "n2", 0)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", iters=100000, gpus=2)])
    async with running_operator(api, lease_s=100.0, clock=clock, fairness_knob=0.0):
        await wait_for(lambda: status(api, "a").get("gpus") == 1, what="A on n1")
        clock.advance(10)  # A's n2 lease will expire 10 s after its n1 lease
        await api.delete(f"/api/v1/namespaces/{NS}/pods/other")
        await wait_for(lambda: status(api, "a").get("gpus") == 2, what="A on n1 and n2")
        clock.advance(10)
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/apps",
            json=app_body("b", [job("j1", iters=100000, gpus=1)]),
        )
        pending = await wait_for(lambda: status(api, "b").get("phase") == "Pending" and status(api, "b"))
        rho_a = status(api, "a")["rho"]
        assert pending["gpus"] == 0 and pending["rho"] > rho_a  # B, holding nothing, has the worse ρ
        assert not pods(api, **{contract.LABEL_APP: "b"})  # nothing is free before the expiry
        clock.advance(80)  # now = A's n1 lease expiry; n2 still has 10 s to run
        await wait_for(lambda: status(api, "b").get("gpus") == 1, what="B wins at expiry")
        got = await wait_for(lambda: pods(api, **{contract.LABEL_APP: "b"}), what="B's pod")
        placement = [json.loads(p["metadata"]["annotations"][contract.ANN_PLACEMENT]) for p in got.values()]
        assert placement == [{"node": "n1", "gpuIndices": [0]}]
        st = status(api, "a")
        assert st["gpus"] == 1 and [lease["node"] for lease in st["leases"]] == ["n2"]
        await wait_for(lambda: events(api, "Preempted"), what="Preempted event")
        deleted = [
            r
            for r in api
            if r.method == "DELETE" and r.resource and r.resource.plural == "pods" and r.name != "other"
        ]
        assert deleted and all("gracePeriodSeconds=5" in str(r.url) for r in deleted)


async def test_delete_cleans_up_through_finalizer(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=2)])
    async with running_operator(api):
        await wait_for(lambda: pods(api, **{contract.LABEL_APP: "a"}), what="pods")
        meta = dict(api.objects[APPS, NS, "a"])["metadata"]
        await wait_for(
            lambda: contract.FINALIZER in dict(api.objects[APPS, NS, "a"])["metadata"].get("finalizers", [])
        )
        assert meta
        await api.delete(f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/apps/a")
        await wait_for(lambda: (APPS, NS, "a") not in api.objects, what="App gone")
        await wait_for(lambda: not pods(api, **{contract.LABEL_APP: "a"}), what="pods deleted")
        await wait_for(lambda: events(api, "Cleanup"), what="Cleanup event")


async def test_invalid_app_gets_condition_event_and_no_pods(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    bad = app_body("bad", [job("j1", gpus=0)])
    api.objects[APPS, NS, "bad"] = bad
    async with running_operator(api):
        st = await wait_for(lambda: status(api, "bad").get("phase") == "Failed" and status(api, "bad"))
        ev = await wait_for(lambda: events(api, "InvalidSpec"), what="event")
    cond = st["conditions"][0]
    assert cond["type"] == "Valid" and cond["status"] == "False"
    assert "spec.jobs[0].maxGPUs" in cond["message"] and "spec.jobs[0].maxGPUs" in ev[0]["message"]
    assert not pods(api)


async def test_restart_keeps_leases_and_creates_no_duplicates(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=2)])
    api.objects[APPS, NS, "b"] = app_body("b", [job("j1", gpus=2)])
    async with running_operator(api, lease_s=60.0) as ctl:
        # Statuses are written concurrently: wait for both Apps' leases, not just the last one seen.
        await wait_for(
            lambda: len(pods(api)) == 2 and all(status(api, n).get("leases") for n in ("a", "b")),
            what="pods and both Apps' leases",
        )
        before = {n: status(api, n)["leases"] for n in ("a", "b")}
        names = set(pods(api))
        assert ctl.arbiter is not None
        # Idempotence: a second pass over the same state writes nothing new.
        creates = sum(1 for r in api if r.method == "POST" and r.resource and r.resource.plural == "pods")
        await ctl.arbiter.run_round(ctl.arbiter.last_round + 0.01)
        await ctl.arbiter.run_round(ctl.arbiter.last_round + 0.01)
        assert set(pods(api)) == names
    async with running_operator(api, lease_s=60.0) as ctl2:
        await wait_for(lambda: ctl2.arbiter is not None and len(ctl2.arbiter.records) == 2, what="recovery")
        assert ctl2.arbiter is not None
        await ctl2.arbiter.maybe_run()
        await ctl2.arbiter.run_round(ctl2.arbiter.last_round + 0.01)
        assert set(pods(api)) == names
        assert {n: status(api, n)["leases"] for n in ("a", "b")} == before
    # A create the restarted operator sends before its pod watch has listed is answered 409 and changes
    # nothing; what matters is that no pod with another name (a second gang) appeared.
    posted = [r for r in api if r.method == "POST" and r.resource and r.resource.plural == "pods"]
    assert {r.data["metadata"]["name"] for r in posted} == names
    assert creates == 2


def status_patches(k: kmock.KubernetesEmulator, name: str) -> int:
    return sum(
        1 for r in k if r.method == "PATCH" and r.name == name and str(r.url).endswith(f"/apps/{name}/status")
    )


async def test_stale_statuses_are_refreshed_between_rounds_a_ticks_share_at_a_time(
    api: kmock.KubernetesEmulator,
) -> None:
    # One GPU, five Apps: four wait. After a lease period every status is stale, but nothing a reader acts
    # on changed for the waiting Apps: the round leaves them to the refresher, which writes at most
    # ceil(5 Apps × tick / (staleness / 2)) = 1 per tick of the operator's clock, oldest first.
    clock = ManualClock()
    add_node(api, "n1", 1)
    names = [f"a{i}" for i in range(5)]
    for n in names:
        api.objects[APPS, NS, n] = app_body(n, [job("j1", iters=10**6, gpus=1)])
    async with running_operator(api, lease_s=100.0, tick_s=0.2, clock=clock) as ctl:
        await wait_for(lambda: all(status(api, n).get("rho") for n in names), what="every status")
        arbiter = ctl.arbiter
        assert arbiter is not None
        await wait_for(lambda: arbiter.lock.locked() is False and not arbiter.dirty, what="quiet")
        before = {n: status_patches(api, n) for n in names}
        rounds = arbiter.rounds
        clock.advance(150.0)  # every lease expired, every status 150 s old (staleness: 100 s)
        await wait_for(lambda: arbiter.rounds > rounds, what="the round after the expiry")
        await wait_for(lambda: arbiter.heartbeats >= 1, what="a first refresh")
        waiting = [n for n in names if not status(api, n).get("leases")]

        # The refresher writes the waiting Apps and, its lease renewed on the same GPU (in the ledger, not in
        # status), the holder, first.
        def fresh() -> bool:
            return all(status(api, n)["elapsedSeconds"] >= 150.0 for n in names)

        for step in range(1, 10):
            if fresh():
                break
            # Per tick of the clock no more than the budget; the refresher runs on the Apps' timers.
            assert arbiter.heartbeats <= step
            clock.advance(0.2)
            await wait_for(lambda s=step: arbiter.heartbeats >= s + 1 or fresh(), what="next refresh")
        assert all(status(api, n)["elapsedSeconds"] >= 150.0 for n in names)
        # The waiting Apps' statuses were each written once since the expiry: by the refresher, not the round.
        assert all(status_patches(api, n) - before[n] == 1 for n in waiting if status(api, n)["gpus"] == 0)


async def test_a_rounds_events_are_folded_into_one_per_app(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=2)])
    async with running_operator(api):
        got = await wait_for(lambda: events(api, "LeaseGranted"), what="LeaseGranted")
        await wait_for(lambda: pods(api, **{contract.LABEL_APP: "a"}), what="pods")
    assert len(got) == 1 and not events(api, "PodsCreated")
    assert "PodsCreated: a-j1-" in got[0]["message"]


async def test_a_lease_renewed_on_the_same_gpus_posts_no_event(api: kmock.KubernetesEmulator) -> None:
    clock = ManualClock()
    add_node(api, "n1", 2)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", iters=10**6, gpus=2)])
    async with running_operator(api, lease_s=100.0, clock=clock) as ctl:
        await wait_for(lambda: events(api, "LeaseGranted"), what="LeaseGranted")
        first = await wait_for(lambda: status(api, "a").get("leases"), what="the lease")
        assert ctl.arbiter is not None
        rounds = ctl.arbiter.rounds
        clock.advance(150.0)  # the lease expires; nobody else bids: the same GPUs again
        renewed = await wait_for(
            lambda: (le := status(api, "a").get("leases")) and le != first and le, what="the renewed lease"
        )
        # The round writes statuses before it ends and posts its events as it ends: wait for both.
        await wait_for(
            lambda: ctl.arbiter is not None and ctl.arbiter.rounds > rounds and not ctl._tasks,
            what="the renewal round ended and its events posted",
        )
    assert [(le["node"], le["gpuIndices"]) for le in renewed] == [
        (le["node"], le["gpuIndices"]) for le in first
    ]
    assert len(events(api, "LeaseGranted")) == 1


async def test_node_heartbeats_start_no_round_and_a_gpu_change_does(api: kmock.KubernetesEmulator) -> None:
    """A node's status heartbeats (every node, every few minutes: thousands a minute at scale) change none
    of its GPUs and must not start an arbiter round; a GPU turning unhealthy in the agent's inventory is a
    resource event and does. Before, every node event set the arbiter dirty: on 1,000 kwok nodes rounds ran
    back to back and the operator never settled."""
    add_node(api, "n1", 2)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=1)])
    async with running_operator(api) as ctl:
        await wait_for(lambda: status(api, "a").get("leases"), what="a lease")
        arbiter = ctl.arbiter
        assert arbiter is not None
        seen = 0
        on_node = ctl.view.on_node

        def counted(body: dict, deleted: bool = False) -> bool:
            nonlocal seen
            seen += 1
            return on_node(body, deleted)

        ctl.view.on_node = counted  # type: ignore[method-assign]
        await wait_for(lambda: not arbiter.dirty and not arbiter.lock.locked(), what="no round pending")
        rounds = arbiter.rounds
        for beat in range(5):
            stamp = f"2026-01-01T00:00:0{beat}Z"
            ready = {"type": "Ready", "status": "True", "lastHeartbeatTime": stamp}
            await api.patch("/api/v1/nodes/n1/status", json={"status": {"conditions": [ready]}})
        await wait_for(lambda: seen >= 5, what="the heartbeats on the node watch")
        assert not arbiter.dirty and arbiter.rounds == rounds

        inv = json.loads(
            dict(api.objects["v1/nodes", None, "n1"])["metadata"]["annotations"][contract.ANN_NODE_GPUS]
        )
        inv[1]["healthy"] = False
        await api.patch(
            "/api/v1/nodes/n1", json={"metadata": {"annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}}
        )
        await wait_for(lambda: arbiter.rounds > rounds, what="a round for the GPU that turned unhealthy")
