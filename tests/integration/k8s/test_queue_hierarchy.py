"""Team queues on a real control plane, beyond two flat queues: a parent's maximum caps its children and a
sibling gets its guarantee back at lease end, the parent's status counting its subtree; a Queue that
breaks the hierarchy says so (Valid=False) and fails closed, its maximum still capping its children, until
fixed; a ModelDeployment's replicas count against its queue and are given back to a queue owed its
guarantee. The operator runs as the chart's ServiceAccount, pods are bound by the real kube-scheduler
through the extender (test_queues.py has the flat cases and the helpers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from tessera.api import contract

from .conftest import Credentials, ManualClock, Nodes, Scheduling, wait_for
from .controlplane import ControlPlane
from .test_app import app_body, app_path, app_pods, job
from .test_queues import QUEUES, gpus, more_rounds, queue_status, seen, teams
from .workloads import (
    bound,
    call,
    cr_path,
    events,
    kubelet,
    modeldeployment,
    operator,
    pods_with,
    release,
    scheduling_report,
    status_of,
)

LONG = 10**8  # iterations: no job ends during a test


def valid(cluster: ControlPlane, queue: str) -> dict[str, Any]:
    """The Queue's Valid condition ({} before the operator wrote one)."""
    conds = queue_status(cluster, queue).get("conditions") or []
    return next((c for c in conds if c.get("type") == "Valid"), {})


async def patch_queue(cluster: ControlPlane, queue: str, spec: dict[str, Any]) -> None:
    await call(
        cluster,
        "PATCH",
        f"{QUEUES}/{queue}",
        {"spec": spec},
        content_type="application/merge-patch+json",
    )


@contextlib.asynccontextmanager
async def peak_held(ctl: Any, namespaces: Iterable[str]) -> AsyncIterator[list[int]]:
    """The most GPUs the Apps of `namespaces` held together, as the operator's rounds left them, sampled
    (between rounds' steps: the loop is shared) while the block runs; `[peak]`."""
    spaces = set(namespaces)
    peak = [0]

    async def watch() -> None:
        while True:
            if ctl.arbiter is not None:
                held = sum(
                    len(r.held())
                    for r in ctl.arbiter.records.values()
                    if not r.done and r.namespace in spaces
                )
                peak[0] = max(peak[0], held)
            await asyncio.sleep(0.02)

    task = asyncio.create_task(watch())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pods_bound(cluster: ControlPlane, ns: str, app: str, n: int) -> bool:
    p = app_pods(cluster, ns, app)
    return len(p) == n and bound(p)


async def test_a_parents_maximum_caps_its_subtree_and_a_sibling_gets_its_guarantee_at_lease_end(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # 8 GPUs; org (guaranteed 4, max 6) holds x and y (guaranteed 2 each, no maximum of their own). x's
    # burst of 8 gets org's 6: two GPUs stay free. y's arrival does not get those (org would hold 8): it
    # gets its guarantee when x's lease ends, and x keeps 4.
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=8)
    specs = {
        "x": {"parent": "org", "guaranteedGPUs": 2},
        "y": {"parent": "org", "guaranteedGPUs": 2},
        "org": {"guaranteedGPUs": 4, "maxGPUs": 6},
    }
    async with (
        teams(cluster, namespace, **specs) as t,
        kubelet(cluster, t["x"]),
        kubelet(cluster, t["y"]),
        operator(cluster, chart_rbac["operator"], t["x"], lease_s=100.0, clock=clock) as ctl,
        peak_held(ctl, (t["x"], t["y"])) as peak,
    ):
        await seen(ctl, t, "x", "y", "org")
        await call(
            cluster, "POST", app_path(t["x"]), app_body("burst", [job(f"j{i}", 1, LONG) for i in range(8)])
        )
        await wait_for(
            lambda: pods_bound(cluster, t["x"], "burst", 6),
            120,
            "6 pods of x",
            lambda: scheduling_report(cluster, t["x"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["x"], "burst") == 6, 60, "x's status")
        await wait_for(lambda: queue_status(cluster, t["x.queue"]).get("shareGPUs") == 6, 60, "x's share")
        await more_rounds(ctl)
        assert gpus(cluster, t["x"], "burst") == 6 and len(app_pods(cluster, t["x"], "burst")) == 6
        assert valid(cluster, t["org.queue"]).get("status") == "True"

        await call(
            cluster, "POST", app_path(t["y"]), app_body("steady", [job("j0", 1, LONG), job("j1", 1, LONG)])
        )
        # y is entitled to its guarantee at once, but the two free GPUs would take org past its maximum.
        await wait_for(
            lambda: (
                queue_status(cluster, t["y.queue"]).get("shareGPUs") == 2
                and queue_status(cluster, t["x.queue"]).get("shareGPUs") == 4
            ),
            60,
            "the shares 4 and 2",
        )
        await more_rounds(ctl)
        assert gpus(cluster, t["y"], "steady") == 0 and not app_pods(cluster, t["y"], "steady")
        assert gpus(cluster, t["x"], "burst") == 6
        # org's status is its subtree's: x's 6 (2 above org's guarantee), x's burst waiting for 2 more and
        # y's App waiting; org's own namespace (no objects) takes no part in it.
        org = await wait_for(
            lambda: (s := queue_status(cluster, t["org.queue"])).get("waiting") == 2 and s,
            60,
            "org's status",
            lambda: str(queue_status(cluster, t["org.queue"])),
        )
        assert (org["shareGPUs"], org["allocatedGPUs"], org["borrowedGPUs"]) == (6, 6, 2), org
        assert sorted((p["queue"], p["name"]) for p in org["pending"]) == [
            (t["x.queue"], "burst"),
            (t["y.queue"], "steady"),
        ], org
        assert org["own"] == {"shareGPUs": 0, "allocatedGPUs": 0, "waiting": 0}, org
        clock.advance(101)  # x's lease ends: org's 6 are divided 4 and 2
        await wait_for(
            lambda: pods_bound(cluster, t["y"], "steady", 2),
            120,
            "y's pods bound on its guarantee",
            lambda: scheduling_report(cluster, t["x"], t["y"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["y"], "steady") == 2, 60, "y's status")
        await wait_for(lambda: len(app_pods(cluster, t["x"], "burst")) == 4, 120, "x down to 4")
        await wait_for(lambda: gpus(cluster, t["x"], "burst") == 4, 60, "x's status")
        assert peak[0] == 6, peak
        await release(cluster, t["y"])


async def test_an_invalid_parent_fails_closed_and_keeps_its_children_within_its_maximum(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    """The defect: a Queue whose parent did not exist was dropped from the division, and its children
    became top-level queues with no cap (children of a 4-guaranteed / 6-max parent got 9 GPUs of 16).
    Now it says Valid=False (InvalidHierarchy, the field in the message) and fails closed: no guarantee,
    but its maximum still caps its children while another queue gets its guarantee. Fixing the Queue
    turns Valid back to True."""
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=8)
    nodes.add(f"{namespace}-n2", gpus=8)
    specs = {
        "x": {"parent": "org", "guaranteedGPUs": 2},
        "y": {"parent": "org", "guaranteedGPUs": 2},
        "org": {"parent": "gone", "guaranteedGPUs": 4, "maxGPUs": 6},  # no Queue "gone"
        "other": {"guaranteedGPUs": 4},
    }
    async with (
        teams(cluster, namespace, **specs) as t,
        kubelet(cluster, t["x"]),
        kubelet(cluster, t["y"]),
        kubelet(cluster, t["other"]),
        operator(cluster, chart_rbac["operator"], t["x"], lease_s=100.0, clock=clock) as ctl,
        peak_held(ctl, (t["x"], t["y"])) as peak,
    ):
        await seen(ctl, t, "x", "y", "org", "other")
        bad = await wait_for(
            lambda: (c := valid(cluster, t["org.queue"])).get("status") == "False" and c,
            60,
            "org Valid=False",
        )
        assert bad["reason"] == "InvalidHierarchy", bad
        tag = t["org.queue"].rpartition("-")[2]
        assert bad["message"].startswith(f"spec.parent: queue 'gone-{tag}' does not exist"), bad
        assert "its maximum still caps it and its children" in bad["message"], bad
        for q in ("x", "y", "other"):  # the children themselves break no rule
            await wait_for(
                lambda q=q: valid(cluster, t[f"{q}.queue"]).get("status") == "True", 60, f"{q} valid"
            )
        for q in ("x", "y"):
            await call(
                cluster, "POST", app_path(t[q]), app_body("burst", [job(f"j{i}", 1, LONG) for i in range(8)])
            )
        await call(
            cluster,
            "POST",
            app_path(t["other"]),
            app_body("steady", [job(f"j{i}", 1, LONG) for i in range(4)]),
        )
        await wait_for(
            lambda: pods_bound(cluster, t["other"], "steady", 4),
            120,
            "other's guarantee",
            lambda: scheduling_report(cluster, t["x"], t["y"], t["other"], scheduling=scheduling),
        )

        def children_pods() -> list[dict[str, Any]]:
            return app_pods(cluster, t["x"], "burst") + app_pods(cluster, t["y"], "burst")

        def subtree() -> int:
            return len(children_pods())

        await wait_for(
            lambda: (p := children_pods()) and len(p) == 6 and bound(p),
            120,
            "org's children on its 6",
            lambda: scheduling_report(cluster, t["x"], t["y"], scheduling=scheduling),
        )
        await more_rounds(ctl)
        assert subtree() == 6 and gpus(cluster, t["x"], "burst") + gpus(cluster, t["y"], "burst") == 6
        assert gpus(cluster, t["other"], "steady") == 4  # 6 of the 16 GPUs stay free
        # A lease period on, the children share org's 6 by their guarantees: 3 and 3.
        clock.advance(101)
        await wait_for(
            lambda: gpus(cluster, t["x"], "burst") == 3 and gpus(cluster, t["y"], "burst") == 3,
            90,
            "3 and 3",
        )
        assert peak[0] == 6, peak

        # Fixed (org made top-level): Valid turns True at the next round.
        await patch_queue(cluster, t["org.queue"], {"parent": None})
        fixed = await wait_for(
            lambda: (c := valid(cluster, t["org.queue"])).get("status") == "True" and c, 60, "org Valid=True"
        )
        assert fixed["reason"] == "Valid", fixed
        for q in ("y", "other"):
            await release(cluster, t[q])


async def test_children_guaranteed_more_than_their_parent_make_it_invalid_until_fixed(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # p (guaranteed 2, max 4) has children guaranteed 2 + 2: p breaks the rule and fails closed, its
    # maximum still capping c1's burst on 8 GPUs; raising p's guarantee to 4 fixes it.
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=8)
    specs = {
        "c1": {"parent": "p", "guaranteedGPUs": 2},
        "c2": {"parent": "p", "guaranteedGPUs": 2},
        "p": {"guaranteedGPUs": 2, "maxGPUs": 4},
    }
    async with (
        teams(cluster, namespace, **specs) as t,
        kubelet(cluster, t["c1"]),
        operator(cluster, chart_rbac["operator"], t["c1"], lease_s=100.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "c1", "c2", "p")
        bad = await wait_for(
            lambda: (c := valid(cluster, t["p.queue"])).get("status") == "False" and c, 60, "p Valid=False"
        )
        assert bad["reason"] == "InvalidHierarchy", bad
        kids = ", ".join(sorted((t["c1.queue"], t["c2.queue"])))
        assert bad["message"].startswith(
            f"spec.guaranteedGPUs: children {kids} are guaranteed 4 GPUs in all, above this queue's 2"
        ), bad
        await call(
            cluster, "POST", app_path(t["c1"]), app_body("burst", [job(f"j{i}", 1, LONG) for i in range(8)])
        )
        await wait_for(
            lambda: pods_bound(cluster, t["c1"], "burst", 4),
            120,
            "4 pods of c1",
            lambda: scheduling_report(cluster, t["c1"], scheduling=scheduling),
        )
        await more_rounds(ctl)
        assert len(app_pods(cluster, t["c1"], "burst")) == 4 and gpus(cluster, t["c1"], "burst") == 4

        await patch_queue(cluster, t["p.queue"], {"guaranteedGPUs": 4})
        fixed = await wait_for(
            lambda: (c := valid(cluster, t["p.queue"])).get("status") == "True" and c, 60, "p Valid=True"
        )
        assert fixed["reason"] == "Valid" and fixed["message"] == "the queue takes part in the division", (
            fixed
        )
        await more_rounds(ctl)
        assert len(app_pods(cluster, t["c1"], "burst")) == 4  # valid or not, p's maximum holds


def workers(cluster: ControlPlane, ns: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods_with(cluster, ns, contract.LABEL_MODELDEPLOYMENT, "m")
        if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "worker"
    ]


async def test_a_modeldeployments_replicas_count_against_its_queue_and_are_given_back(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # 4 GPUs; a (guaranteed 1, max 3) serves a model at 300 rps: two 1-GPU replicas, one borrowed from b's
    # idle guarantee (test_modeldeployment.py has the arithmetic). a's App gets the rest of a's maximum: 1,
    # with a GPU free. b (guaranteed 3) then asks for 3: the free GPUs at once, and the borrowed replica
    # is given back for the third.
    nodes.add(f"{namespace}-n1", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    specs = {"a": {"guaranteedGPUs": 1, "maxGPUs": 3}, "b": {"guaranteedGPUs": 3}}
    mds = cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace)
    async with (
        teams(cluster, namespace, **specs) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(
            cluster,
            chart_rbac["operator"],
            t["a"],
            lease_s=1000.0,
            clock=ManualClock(),
            serving_stats_interval_s=0,
        ) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await wait_for(lambda: f"{namespace}-n1" in ctl.view.nodes, 60, "the node in the operator's view")
        await call(cluster, "POST", mds, modeldeployment("m", 300))
        await wait_for(
            lambda: (w := workers(cluster, t["a"])) and len(w) == 2 and bound(w),
            120,
            "2 replicas bound",
            lambda: scheduling_report(cluster, t["a"], scheduling=scheduling),
        )
        await call(
            cluster, "POST", app_path(t["a"]), app_body("rest", [job(f"j{i}", 1, LONG) for i in range(4)])
        )
        await wait_for(
            lambda: pods_bound(cluster, t["a"], "rest", 1),
            120,
            "a's App on the one GPU its replicas leave",
            lambda: scheduling_report(cluster, t["a"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["a"], "rest") == 1, 60, "the App's status")
        await more_rounds(ctl)
        assert gpus(cluster, t["a"], "rest") == 1 and len(app_pods(cluster, t["a"], "rest")) == 1
        assert len(workers(cluster, t["a"])) == 2
        assert queue_status(cluster, t["a.queue"]).get("shareGPUs") == 3
        await call(cluster, "DELETE", app_path(t["a"], "rest"))
        await wait_for(lambda: cluster.request("GET", app_path(t["a"], "rest"))[0] == 404, 60, "the App gone")

        await call(
            cluster, "POST", app_path(t["b"]), app_body("steady", [job(f"j{i}", 1, LONG) for i in range(3)])
        )
        # No lease ends (the clock stands still): replicas hold none, so the borrowed one goes at once.
        await wait_for(
            lambda: pods_bound(cluster, t["b"], "steady", 3),
            120,
            "b's guarantee, a GPU of it from a replica",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["b"], "steady") == 3, 60, "b's status")
        await wait_for(lambda: len(workers(cluster, t["a"])) == 1, 60, "the borrowed replica's pod deleted")
        got = await wait_for(
            lambda: [
                e
                for e in events(cluster, t["a"], "Reclaimed")
                if e["involvedObject"]["kind"] == "ModelDeployment"
            ],
            60,
            "the event on the ModelDeployment",
        )
        assert (
            "1 replica(s)" in got[0]["message"] and f"given back to queue {t['b.queue']}" in got[0]["message"]
        )
        await wait_for(
            lambda: [
                e
                for e in events(cluster, "default", "Reclaimed")
                if e["involvedObject"]["name"] == t["b.queue"]
            ],
            60,
            "the event on b's Queue",
        )
        # The deployment still wants 2 replicas but stays within a's share: it does not take the GPU back.
        await wait_for(
            lambda: status_of(cluster, contract.PLURAL_MODELDEPLOYMENT, t["a"], "m").get("replicas") == 1,
            60,
            "the deployment's status with 1 replica",
        )
        await more_rounds(ctl)
        assert len(workers(cluster, t["a"])) == 1
        await release(cluster, t["b"])
