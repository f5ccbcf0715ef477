"""Team queues on a real control plane: two Queues serving two labelled namespaces; team A's burst borrows
team B's idle GPUs up to A's maximum (the Queue's status and `kubectl get tq` show A's App and TrialGroup
waiting, and why); B's arrival gets them back when A's lease ends, or at once under
`immediate` (A's pods deleted with A's checkpoint grace, events on both sides); deleting a Queue moves its
namespace's Apps to `default`. The operator runs as the chart's ServiceAccount, pods are bound by the real
kube-scheduler through the extender."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from tessera.api import contract

from .conftest import (
    Credentials,
    ManualClock,
    Nodes,
    Scheduling,
    delete_namespace,
    running_operator,
    wait_for,
)
from .controlplane import ControlPlane
from .test_app import app_body, app_path, app_pods, app_status, job
from .workloads import bound, call, events, kubelet, operator, pods_with, release, scheduling_report

QUEUES = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_QUEUE}"


async def label_namespace(cluster: ControlPlane, namespace: str, queue: str) -> None:
    """The namespace joins `queue` (the label a team's admin sets)."""
    await call(
        cluster,
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {contract.LABEL_QUEUE: queue}}},
        content_type="application/merge-patch+json",
    )


@contextlib.asynccontextmanager
async def teams(cluster: ControlPlane, first: str, **specs: dict[str, Any]) -> AsyncIterator[dict[str, str]]:
    """A Queue per entry of `specs` and a namespace labelled for each (the first is the test's own
    `first`, the others made here); queue name → namespace. A `parent` names another entry of `specs`
    (or a Queue that never exists). All removed afterwards."""
    tag = secrets.token_hex(3)
    out: dict[str, str] = {}
    made: list[str] = []
    try:
        for i, (team, spec) in enumerate(specs.items()):
            queue = f"{team}-{tag}"
            if spec.get("parent"):  # the parent's name carries the tag too
                spec = {**spec, "parent": f"{spec['parent']}-{tag}"}
            body = {
                "apiVersion": contract.API_VERSION,
                "kind": "Queue",
                "metadata": {"name": queue},
                "spec": spec,
            }
            await call(cluster, "POST", QUEUES, body)
            ns = first if i == 0 else f"{team}-{tag}"
            if i:
                await call(cluster, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
                made.append(ns)
            await label_namespace(cluster, ns, queue)
            out[team] = ns
            out[f"{team}.queue"] = queue
        yield out
    finally:
        for team in specs:
            cluster.request("DELETE", f"{QUEUES}/{team}-{tag}")
        for ns in made:
            delete_namespace(cluster, ns)


def queue_status(cluster: ControlPlane, name: str) -> dict[str, Any]:
    return dict((cluster.get(f"{QUEUES}/{name}") or {}).get("status") or {})


def trialgroups_path(ns: str) -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.PLURAL_TRIALGROUP}"


def trialgroup_body(name: str, gpus: int) -> dict[str, Any]:
    trials = [
        {"name": n, "budgetIterations": 10**6, "iterTimeSeconds": 1.0, "config": {}} for n in ("x", "y")
    ]
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"containers": [{"name": "trial", "image": "trainer:1"}]}},
            "trials": trials,
            "gpus": gpus,
        },
    }


def gpus(cluster: ControlPlane, ns: str, app: str) -> int:
    return int(app_status(cluster, ns, app).get("gpus") or 0)


async def seen(ctl: Any, t: dict[str, str], *teams_: str) -> None:
    """The operator's watches have both the Queues and the namespace labels."""
    await wait_for(
        lambda: all(ctl.queues.queue_of(t[x]) == t[f"{x}.queue"] for x in teams_),
        60,
        "queues and labels seen",
    )


async def test_borrow_up_to_max_then_reclaim_at_lease_end(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    specs = {"a": {"guaranteedGPUs": 2, "maxGPUs": 3}, "b": {"guaranteedGPUs": 2}}
    async with (
        teams(cluster, namespace, **specs) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=100.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await call(
            cluster,
            "POST",
            app_path(t["a"]),
            app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(4)]),
        )
        # A borrows B's idle guarantee, but only up to its maximum of 3.
        await wait_for(
            lambda: (p := app_pods(cluster, t["a"], "burst")) and len(p) == 3 and bound(p),
            120,
            "3 pods of A",
            lambda: scheduling_report(cluster, t["a"], scheduling=scheduling),
        )
        # Statuses are written after the pods; wait for A's.
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 3, 60, "A's status")
        st = await wait_for(
            lambda: (s := queue_status(cluster, t["a.queue"])).get("allocatedGPUs") == 3 and s,
            60,
            "A's status",
        )
        assert st["borrowedGPUs"] == 1 and st["namespaces"] == [t["a"]]
        # A TrialGroup of A's asks for 2 more: A is at its maximum, so it waits, and so does the App's
        # fourth job. The Queue's status counts both kinds and says why each waits; kubectl shows Pending.
        await call(cluster, "POST", trialgroups_path(t["a"]), trialgroup_body("sweep", gpus=2))
        st = await wait_for(
            lambda: len((s := queue_status(cluster, t["a.queue"])).get("pending") or []) == 2 and s,
            60,
            "A's pending list",
        )
        assert st["allocatedByKind"] == {"apps": 3, "trialGroups": 0, "modelDeployments": 0, "pods": 0}
        assert (st["waiting"], st["waitingByKind"]) == (
            2,
            {"apps": 1, "trialGroups": 1, "modelDeployments": 0, "pods": 0},
        )
        waits = {(p["kind"], p["name"]): (p["gpus"], p["reason"], p["message"]) for p in st["pending"]}
        assert waits == {
            ("App", "burst"): (1, "QueueAtMax", f"queue {t['a.queue']} holds 3 GPUs, its maxGPUs 3"),
            ("TrialGroup", "sweep"): (2, "QueueAtMax", f"queue {t['a.queue']} holds 3 GPUs, its maxGPUs 3"),
        }
        printed = await asyncio.to_thread(cluster.kubectl, "get", "tq", t["a.queue"])
        header, row = printed.stdout.splitlines()[:2]
        columns = dict(zip(header.split(), row.split(), strict=False))
        assert (columns["ALLOCATED"], columns["PENDING"]) == ("3", "2"), printed.stdout
        await call(
            cluster,
            "POST",
            app_path(t["b"]),
            app_body("steady", [job("j0", 1, 10**8), job("j1", 1, 10**8)]),
        )
        # The free GPU at once; the borrowed one only when A's lease ends.
        await wait_for(lambda: gpus(cluster, t["b"], "steady") == 1, 90, "B on the free GPU")
        assert gpus(cluster, t["a"], "burst") == 3
        clock.advance(101)
        await wait_for(lambda: gpus(cluster, t["b"], "steady") == 2, 90, "B's guarantee back at lease end")
        await wait_for(
            lambda: (p := app_pods(cluster, t["b"], "steady")) and len(p) == 2 and bound(p),
            120,
            "B's pods bound",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        await wait_for(lambda: len(app_pods(cluster, t["a"], "burst")) == 2, 120, "A down to its guarantee")
        await call(cluster, "DELETE", app_path(t["b"], "steady"))
        await wait_for(
            lambda: cluster.request("GET", app_path(t["b"], "steady"))[0] == 404, 60, "B's App gone"
        )


async def test_a_lending_limit_keeps_part_of_an_idle_guarantee_for_its_team(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # 4 GPUs; A is guaranteed 3 and lends at most 1 of them: 2 stay reserved for A while it is idle.
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    specs = {"a": {"guaranteedGPUs": 3, "lendingLimitGPUs": 1}, "b": {"guaranteedGPUs": 1}}
    async with (
        teams(cluster, namespace, **specs) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=100.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await call(
            cluster, "POST", app_path(t["b"]), app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(4)])
        )
        # B borrows only A's lendable GPU: 1 + 1, not all 4.
        await wait_for(
            lambda: (p := app_pods(cluster, t["b"], "burst")) and len(p) == 2 and bound(p),
            120,
            "2 pods of B",
            lambda: scheduling_report(cluster, t["b"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["b"], "burst") == 2, 60, "B's status")
        st = await wait_for(
            lambda: (s := queue_status(cluster, t["a.queue"])).get("lentGPUs") == 1 and s, 60, "A's status"
        )
        assert st["allocatedGPUs"] == 0
        assert len(app_pods(cluster, t["b"], "burst")) == 2 and gpus(cluster, t["b"], "burst") == 2
        # A's App gets the 2 reserved GPUs at once: no lease has to end (the clock does not move).
        await call(
            cluster, "POST", app_path(t["a"]), app_body("ready", [job("j0", 1, 10**8), job("j1", 1, 10**8)])
        )
        await wait_for(
            lambda: (p := app_pods(cluster, t["a"], "ready")) and len(p) == 2 and bound(p),
            120,
            "A's pods on the reserved GPUs",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        assert gpus(cluster, t["b"], "burst") == 2 and len(app_pods(cluster, t["b"], "burst")) == 2


async def test_immediate_reclaim_and_deleting_a_queue(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    spec_a = {
        "guaranteedGPUs": 2,
        "maxGPUs": 3,
        "reclaim": {"mode": "immediate", "checkpointGraceSeconds": 3},
    }
    async with (
        teams(cluster, namespace, a=spec_a, b={"guaranteedGPUs": 2}) as t,
        kubelet(cluster, t["a"]) as kl,
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await call(
            cluster,
            "POST",
            app_path(t["a"]),
            app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(4)]),
        )
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 3, 90, "A at its maximum")
        # Only pods deleted from here on are the reclaim's (A may have been trimmed to its maximum before).
        earlier = set(kl.grace)
        await call(
            cluster,
            "POST",
            app_path(t["b"]),
            app_body("steady", [job("j0", 1, 10**8), job("j1", 1, 10**8)]),
        )
        # No lease ends (the clock stands still): B gets its guarantee back at once.
        await wait_for(lambda: gpus(cluster, t["b"], "steady") == 2, 90, "B's guarantee back at once")
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 2, 60, "A down to its guarantee")
        await wait_for(lambda: events(cluster, t["a"], "Reclaimed"), 60, "the event on A's App")
        on_queue = await wait_for(
            lambda: [
                e
                for e in events(cluster, "default", "Reclaimed")
                if e["involvedObject"]["name"] == t["b.queue"]
            ],
            60,
            "the event on B's Queue",
        )
        assert "below its guarantee" in on_queue[0]["message"]
        await wait_for(lambda: set(kl.grace) - earlier, 60, "A's reclaimed pod deleted")
        assert {kl.grace[p] for p in set(kl.grace) - earlier} == {3}, kl.grace  # A's checkpoint grace
        await release(cluster, t["b"])
        # Deleting A's Queue: its namespace's App belongs to default, where no maximum holds it.
        await call(cluster, "DELETE", f"{QUEUES}/{t['a.queue']}")
        await wait_for(lambda: ctl.queues.queue_of(t["a"]) == "default", 60, "A's namespace in default")
        clock.advance(1001)
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 4, 90, "A on all four GPUs under default")


async def test_a_trialgroup_waiting_within_its_queues_share_gets_the_guarantee_back(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # A TrialGroup is work waiting as much as an App is: team B's pool of 2 comes out of the free GPU and
    # one taken back from A (immediate), and the trials' pods are bound on the pool by the real scheduler.
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    spec_a = {
        "guaranteedGPUs": 2,
        "maxGPUs": 3,
        "reclaim": {"mode": "immediate", "checkpointGraceSeconds": 3},
    }
    tg = trialgroup_body("sweep", gpus=2)
    async with (
        teams(cluster, namespace, a=spec_a, b={"guaranteedGPUs": 2}) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await call(
            cluster, "POST", app_path(t["a"]), app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(4)])
        )
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 3, 90, "A at its maximum")
        tgs = trialgroups_path(t["b"])
        await call(cluster, "POST", tgs, tg)
        await wait_for(
            lambda: (
                (p := pods_with(cluster, t["b"], contract.LABEL_TRIALGROUP, "sweep"))
                and len(p) == 2
                and bound(p)
            ),
            120,
            "both trials' pods bound on the pool",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 2, 60, "A down to its guarantee")
        pool = json.loads(
            (cluster.get(f"{tgs}/sweep") or {})["metadata"]["annotations"][contract.ANN_GPU_POOL]
        )
        leases = app_status(cluster, t["a"], "burst").get("leases") or []
        held = {f"{le['node']}/{i}" for le in leases for i in le["gpuIndices"]}
        assert len(pool) == 2 and not held & set(pool), (pool, held)
        await wait_for(lambda: events(cluster, t["a"], "Reclaimed"), 60, "the event on A's App")


async def test_a_trialgroup_pool_above_its_queues_share_gives_gpus_back(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # Team A's TrialGroup borrows B's idle guarantee for its pool; B's App gets it back at once
    # (`immediate`): the pool shrinks, Fluid re-plans the trials on what is left, the pods on the given-back
    # GPUs go with A's checkpoint grace, and B's pods are bound there by the real scheduler.
    clock = ManualClock()
    # Lanes: the trials re-planned on the pool that is left pack two to a GPU.
    nodes.add(f"{namespace}-n1", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    spec_a = {"guaranteedGPUs": 2, "reclaim": {"mode": "immediate", "checkpointGraceSeconds": 3}}
    trials = [
        {"name": f"t{i}", "budgetIterations": 10**6, "iterTimeSeconds": 1.0, "config": {}} for i in range(4)
    ]
    tg = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": "sweep"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "trial", "image": "trainer:1"}]}},
            "trials": trials,
        },
    }
    async with (
        teams(cluster, namespace, a=spec_a, b={"guaranteedGPUs": 2}) as t,
        kubelet(cluster, t["a"]) as kl,
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        tgs = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{t['a']}/{contract.PLURAL_TRIALGROUP}"

        def pool() -> list[str]:
            ann = ((cluster.get(f"{tgs}/sweep") or {}).get("metadata") or {}).get("annotations") or {}
            return list(json.loads(ann.get(contract.ANN_GPU_POOL) or "[]"))

        await call(cluster, "POST", tgs, tg)
        await wait_for(
            lambda: (
                len(pool()) == 4
                and (p := pods_with(cluster, t["a"], contract.LABEL_TRIALGROUP, "sweep"))
                and len(p) == 4
                and bound(p)
            ),
            120,
            "the pool of 4 and its trials' pods bound",
            lambda: f"pool {pool()}\n" + scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        await call(
            cluster, "POST", app_path(t["b"]), app_body("steady", [job("j0", 1, 10**8), job("j1", 1, 10**8)])
        )
        try:
            await wait_for(
                lambda: (p := app_pods(cluster, t["b"], "steady")) and len(p) == 2 and bound(p),
                120,
                "B's pods bound on GPUs the pool gave back",
                lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
            )
        except AssertionError as err:
            b_pods = [
                (p["metadata"]["name"], p["spec"].get("nodeName"))
                for p in app_pods(cluster, t["b"], "steady")
            ]
            a_pods = [
                (
                    p["metadata"]["name"],
                    p["metadata"].get("annotations", {}).get(contract.ANN_PLACEMENT),
                    p["metadata"].get("deletionTimestamp"),
                )
                for p in pods_with(cluster, t["a"], contract.LABEL_TRIALGROUP, "sweep")
            ]
            got = [(e["reason"], e["message"]) for e in events(cluster, t["a"], "Reclaimed")]
            raise AssertionError(
                f"{err}\npool {pool()}\nB {app_status(cluster, t['b'], 'steady')}\nB pods {b_pods}\n"
                f"A pods {a_pods}\nA deleted {kl.grace}\nA events {got}\nreclaims {ctl.arbiter and ctl.arbiter.outside_reclaims}"
            ) from err
        assert len(pool()) == 2, pool()
        assert kl.grace and set(kl.grace.values()) == {3}, kl.grace  # A's checkpoint grace
        got = await wait_for(lambda: events(cluster, t["a"], "Reclaimed"), 60, "the event on the TrialGroup")
        assert "given back to queue" in got[0]["message"]


async def more_rounds(ctl: Any, n: int = 3) -> None:
    """`n` more arbiter rounds (each App status due is written in its round)."""
    await wait_for(lambda: ctl.arbiter is not None, 60, "the login")
    arbiter = ctl.arbiter
    rounds = arbiter.rounds
    for _ in range(n):
        arbiter.dirty = True
        await wait_for(lambda: not arbiter.dirty, 60, "a round")
    await wait_for(lambda: arbiter.rounds >= rounds + n, 60, f"{n} more rounds")


async def steady_through_a_start(ctl: Any, cluster: ControlPlane, ns: str, status: str) -> None:
    """From an operator's start through three rounds, the App's QueueResolved condition reads `status`
    every time it is looked at (a first round that ran before the namespace labels and Queues were loaded
    dropped it, or turned it False)."""
    seen: list[dict[str, Any]] = []

    async def watch() -> None:
        while True:
            seen.append(queue_resolved(cluster, ns, "train"))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        await more_rounds(ctl)
    finally:
        watcher.cancel()
    assert seen and all(c.get("status") == status for c in seen), seen


def queue_resolved(cluster: ControlPlane, ns: str, app: str) -> dict[str, Any]:
    """The App's QueueResolved condition ({} while it has none)."""
    conds = app_status(cluster, ns, app).get("conditions") or []
    return next((c for c in conds if c.get("type") == "QueueResolved"), {})


async def test_an_app_in_a_namespace_naming_a_missing_queue_says_so_until_the_queue_exists(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    """The defect: a namespace labelled with a queue that does not exist went to `default` with no event or
    condition. The App says so (QueueResolved=False, QueueNotFound, one Warning event, not repeated by
    later rounds nor by a restarted operator), and creating the Queue turns the condition True without a
    restart. No scheduler: status and events only."""
    nodes.add(f"{namespace}-n1", gpus=2)
    queue = f"ghost-{secrets.token_hex(3)}"
    await label_namespace(cluster, namespace, queue)
    await call(cluster, "POST", app_path(namespace), app_body("train", [job("j0", 1, 10**8)]))

    def warned() -> list[dict[str, Any]]:
        return [
            e for e in events(cluster, namespace, "QueueNotFound") if e["involvedObject"]["name"] == "train"
        ]

    try:
        async with running_operator(cluster, chart_rbac["operator"]) as ctl:
            missing = await wait_for(
                lambda: (c := queue_resolved(cluster, namespace, "train")).get("status") == "False" and c,
                90,
                "QueueResolved=False on the App",
                lambda: json.dumps(app_status(cluster, namespace, "train")),
            )
            assert missing["reason"] == "QueueNotFound", missing
            assert f"{contract.LABEL_QUEUE}={queue}" in missing["message"] and "default" in missing["message"]
            got = await wait_for(warned, 60, "the QueueNotFound event on the App")
            assert got[0]["type"] == "Warning" and got[0]["message"] == missing["message"]
            described = (
                await asyncio.to_thread(cluster.kubectl, "describe", "-n", namespace, "app/train")
            ).stdout
            assert "QueueNotFound" in described and "QueueResolved" in described, described
            assert ctl.queues.queue_of(namespace) == "default"
            await more_rounds(ctl)
            assert len(warned()) == 1, warned()
        # A restarted operator (or a standby taking over) finds the condition written: no second event,
        # and the condition stays as it is while the new operator loads the namespaces and Queues.
        async with running_operator(cluster, chart_rbac["operator"]) as ctl:
            await steady_through_a_start(ctl, cluster, namespace, "False")
            assert len(warned()) == 1, warned()
            # The Queue created: the condition turns True, without a restart.
            await call(
                cluster,
                "POST",
                QUEUES,
                {
                    "apiVersion": contract.API_VERSION,
                    "kind": "Queue",
                    "metadata": {"name": queue},
                    "spec": {},
                },
            )
            # What docs/queues.md tells users to run.
            waited = await asyncio.to_thread(
                cluster.kubectl,
                *("wait", "--for=condition=QueueResolved", "--timeout=90s", "-n", namespace, "app/train"),
                check=False,
            )
            assert waited.returncode == 0, waited.stderr + waited.stdout
            found = await wait_for(
                lambda: (c := queue_resolved(cluster, namespace, "train")).get("status") == "True" and c,
                90,
                "QueueResolved=True once the Queue exists",
                lambda: json.dumps(app_status(cluster, namespace, "train")),
            )
            assert found["reason"] == "QueueFound" and f"in queue {queue}" in found["message"], found
            assert ctl.queues.queue_of(namespace) == queue
            assert len(warned()) == 1, warned()
            await wait_for(
                lambda: [
                    e
                    for e in events(cluster, namespace, "QueueResolved")
                    if e["involvedObject"]["name"] == "train" and e["type"] == "Normal"
                ],
                60,
                "the QueueResolved event on the App",
            )
        # Restarted with the Queue there: no Warning for a namespace whose Queue exists.
        async with operator(cluster, chart_rbac["operator"], namespace) as ctl:
            await steady_through_a_start(ctl, cluster, namespace, "True")
            assert len(warned()) == 1, warned()
    finally:
        cluster.request("DELETE", f"{QUEUES}/{queue}")
