"""Priority and preemption in team queues on a real control plane: PriorityClasses created through the API
give Apps their priority; a higher-priority App in a full queue takes GPUs from a lower-priority one
(`preemption.withinQueue: LowerPriority`); a queue reclaiming under `reclaimWithinCohort: LowerPriority`
takes only lower-priority holdings; a queue borrowing under `borrowWithinCohort: LowerPriority` takes
GPUs at once from a lower-priority App of another borrowing queue; and an `immediate` reclaim waits for the lender's `minRuntimeSeconds`
counted from the start of its holding, not from the App's creation. The operator runs as the chart's
ServiceAccount (so its RBAC must allow watching PriorityClasses), pods are bound by the real kube-scheduler
through the extender."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from ..clock import ManualClock
from .conftest import Credentials, Nodes, Scheduling, wait_for
from .controlplane import ControlPlane
from .test_app import app_body, app_path, app_pods, app_status, job
from .test_queues import gpus, seen, teams
from .workloads import bound, call, events, kubelet, operator, scheduling_report

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


@contextlib.asynccontextmanager
async def priority_classes(cluster: ControlPlane, **values: int) -> AsyncIterator[dict[str, str]]:
    """A PriorityClass per entry (a unique name each); short name → class name. Deleted afterwards."""
    tag = secrets.token_hex(3)
    names = {short: f"{short}-{tag}" for short in values}
    try:
        for short, value in values.items():
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": names[short]},
                "value": value,
            }
            await call(cluster, "POST", PRIORITY_CLASSES, body)
        yield names
    finally:
        for name in names.values():
            cluster.request("DELETE", f"{PRIORITY_CLASSES}/{name}")


def ranked_app(name: str, jobs: list[dict[str, Any]], priority_class: str | None) -> dict[str, Any]:
    body = app_body(name, jobs)
    if priority_class is not None:
        body["spec"]["priorityClassName"] = priority_class
    return body


def pod_classes(cluster: ControlPlane, ns: str, app: str) -> set[str | None]:
    return {p["spec"].get("priorityClassName") for p in app_pods(cluster, ns, app)}


def stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def test_a_high_priority_app_in_a_full_queue_takes_gpus_from_a_low_priority_one(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    spec = {
        "guaranteedGPUs": 4,
        "preemption": {"withinQueue": "LowerPriority"},
        "reclaim": {"checkpointGraceSeconds": 3},
    }
    async with (
        priority_classes(cluster, high=1000, low=10) as pc,
        teams(cluster, namespace, a=spec) as t,
        kubelet(cluster, t["a"]) as kl,
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a")
        await wait_for(
            lambda: ctl.priority_classes is not None and pc["high"] in ctl.priority_classes,
            60,
            "classes seen",
        )
        low = ranked_app("bulk", [job(f"j{i}", 1, 10**8) for i in range(4)], pc["low"])
        await call(cluster, "POST", app_path(t["a"]), low)
        await wait_for(lambda: gpus(cluster, t["a"], "bulk") == 4, 90, "the low-priority App on all 4 GPUs")
        earlier = set(kl.grace)
        # The queue is full and no lease ends (the clock stands still): the high-priority App gets 2 GPUs
        # of the low-priority one at once.
        high = ranked_app("vip", [job("j0", 1, 10**8), job("j1", 1, 10**8)], pc["high"])
        await call(cluster, "POST", app_path(t["a"]), high)
        await wait_for(
            lambda: (p := app_pods(cluster, t["a"], "vip")) and len(p) == 2 and bound(p),
            120,
            "the high-priority App's pods bound",
            lambda: scheduling_report(cluster, t["a"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["a"], "bulk") == 2, 60, "the low-priority App down to 2")
        # The App says why (the pod sync's own Preempted event lists the pods it deleted).
        preempted = await wait_for(
            lambda: [
                e
                for e in events(cluster, t["a"], "Preempted")
                if e["involvedObject"]["kind"] == "App" and "higher-priority" in e["message"]
            ],
            60,
            "the event on bulk",
        )
        assert {e["involvedObject"]["name"] for e in preempted} == {"bulk"}, preempted
        # Tessera, not kube-scheduler, chose what to preempt: the pods carry no PriorityClass of the App's.
        assert [e for e in events(cluster, t["a"], "Preempted") if e["involvedObject"]["kind"] == "Pod"] == []
        await wait_for(lambda: set(kl.grace) - earlier, 60, "bulk's preempted pods deleted")
        assert {kl.grace[p] for p in set(kl.grace) - earlier} == {3}, kl.grace  # the queue's checkpoint grace
        assert pod_classes(cluster, t["a"], "vip") == {None}
        # An App naming a class that does not exist waits at priority 0, with a Warning that says why.
        ghost = ranked_app("ghost", [job("j0", 1, 10**8)], f"missing-{pc['high']}")
        await call(cluster, "POST", app_path(t["a"]), ghost)
        missing = await wait_for(
            lambda: events(cluster, t["a"], "PriorityClassNotFound"), 60, "the event on the App"
        )
        assert f"no PriorityClass missing-{pc['high']} exists" in missing[0]["message"]
        assert gpus(cluster, t["a"], "vip") == 2


async def test_reclaim_by_priority_takes_only_lower_priority_holdings(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # 4 GPUs. Team A (no guarantee, lends under immediate) runs a priority-1000 App and a priority-10 App
    # on 2 GPUs each. Team B (guaranteed 3, reclaimWithinCohort LowerPriority) asks for 3 with a
    # priority-500 App: it takes the priority-10 App's 2 GPUs at once, and not the third from the
    # priority-1000 App (reclaimWithinCohort Any would have); that one waits for a lease to end.
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    spec_a = {"reclaim": {"mode": "immediate", "checkpointGraceSeconds": 3}}
    spec_b = {"guaranteedGPUs": 3, "preemption": {"reclaimWithinCohort": "LowerPriority"}}
    async with (
        priority_classes(cluster, high=1000, mid=500, low=10) as pc,
        teams(cluster, namespace, a=spec_a, b=spec_b) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await wait_for(
            lambda: ctl.priority_classes is not None and pc["low"] in ctl.priority_classes, 60, "classes seen"
        )
        two = [job("j0", 1, 10**8), job("j1", 1, 10**8)]
        await call(cluster, "POST", app_path(t["a"]), ranked_app("vip", two, pc["high"]))
        await call(cluster, "POST", app_path(t["a"]), ranked_app("bulk", two, pc["low"]))
        await wait_for(
            lambda: gpus(cluster, t["a"], "vip") == 2 and gpus(cluster, t["a"], "bulk") == 2,
            90,
            "A's Apps on 2 GPUs each",
        )
        mid = ranked_app("mid", [job(f"j{i}", 1, 10**8) for i in range(3)], pc["mid"])
        await call(cluster, "POST", app_path(t["b"]), mid)
        await wait_for(
            lambda: (p := app_pods(cluster, t["b"], "mid")) and len(p) == 2 and bound(p),
            120,
            "B's pods bound on bulk's GPUs",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["b"], "mid") == 2, 60, "B's status")
        await wait_for(lambda: gpus(cluster, t["a"], "bulk") == 0, 60, "bulk gave its GPUs back")
        reclaimed = await wait_for(lambda: events(cluster, t["a"], "Reclaimed"), 60, "the event on A")
        # Another round changes nothing: the priority-1000 holding is not B's to take before its lease ends.
        arbiter = ctl.need(ctl.arbiter)
        before = arbiter.rounds
        arbiter.dirty = True
        await wait_for(lambda: arbiter.rounds > before, 60, "a round")
        assert gpus(cluster, t["a"], "vip") == 2 and gpus(cluster, t["b"], "mid") == 2
        reclaimed = events(cluster, t["a"], "Reclaimed")
        assert {e["involvedObject"]["name"] for e in reclaimed} == {"bulk"}, reclaimed


async def test_an_immediate_reclaim_waits_for_min_runtime_from_the_holdings_start(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # Team A's App is created at t0 but gets GPUs only at t0+400, when the node comes. Team B then asks for
    # its guarantee. A lends under immediate with a 300 s minimum runtime: counted from the App's creation
    # it would go at once; counted from its holding, not before t0+700.
    clock = ManualClock()
    spec_a = {
        "guaranteedGPUs": 2,
        "reclaim": {"mode": "immediate", "minRuntimeSeconds": 300, "checkpointGraceSeconds": 3},
    }
    async with (
        teams(cluster, namespace, a=spec_a, b={"guaranteedGPUs": 2}) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=5000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        t0 = clock.now
        burst = app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(4)])
        await call(cluster, "POST", app_path(t["a"]), burst)
        await wait_for(lambda: (t["a"], "burst") in ctl.need(ctl.arbiter).records, 60, "A's App tracked")
        clock.advance(400)
        nodes.add(f"{namespace}-n1", gpus=4)
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 4, 90, "A on all 4 GPUs")
        st = app_status(cluster, t["a"], "burst")
        assert stamp(st["startTime"]) == t0
        assert stamp(st["holdingSince"]) >= t0 + 400, st
        await call(
            cluster, "POST", app_path(t["b"]), app_body("steady", [job("j0", 1, 10**8), job("j1", 1, 10**8)])
        )
        await wait_for(lambda: (t["b"], "steady") in ctl.need(ctl.arbiter).records, 60, "B tracked")

        async def a_round() -> None:
            arbiter = ctl.need(ctl.arbiter)
            before = arbiter.rounds
            arbiter.dirty = True
            await wait_for(lambda: arbiter.rounds > before, 60, "a round")

        await a_round()
        assert gpus(cluster, t["b"], "steady") == 0 and gpus(cluster, t["a"], "burst") == 4
        clock.advance(200)  # t0+600: 600 s since the App was created, 200 s since its holding began
        await a_round()
        assert gpus(cluster, t["b"], "steady") == 0 and gpus(cluster, t["a"], "burst") == 4
        assert not events(cluster, t["a"], "Reclaimed")
        # Past t0+700 the operator runs a round by itself (no lease ends before t0+5000).
        clock.advance(101)
        await wait_for(
            lambda: gpus(cluster, t["b"], "steady") == 2, 90, "B's guarantee back after minRuntime"
        )
        await wait_for(lambda: gpus(cluster, t["a"], "burst") == 2, 60, "A down to its guarantee")
        await wait_for(lambda: events(cluster, t["a"], "Reclaimed"), 60, "the event on A's App")


async def test_a_non_preemptible_app_keeps_its_gpus_past_its_lease_ends(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # The low-priority App is non-preemptible: neither the high-priority App (withinQueue LowerPriority)
    # nor its lease ending takes its GPUs; the high-priority App gets them once it is deleted.
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    spec = {"guaranteedGPUs": 4, "maxGPUs": 4, "preemption": {"withinQueue": "LowerPriority"}}
    async with (
        priority_classes(cluster, high=1000, low=10) as pc,
        teams(cluster, namespace, a=spec) as t,
        kubelet(cluster, t["a"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=100.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a")
        await wait_for(
            lambda: ctl.priority_classes is not None and pc["high"] in ctl.priority_classes,
            60,
            "classes seen",
        )
        pinned = ranked_app("pinned", [job(f"j{i}", 1, 10**8) for i in range(4)], pc["low"])
        pinned["spec"]["preemptible"] = False
        await call(cluster, "POST", app_path(t["a"]), pinned)
        await wait_for(lambda: gpus(cluster, t["a"], "pinned") == 4, 90, "the pinned App on all 4 GPUs")
        await call(cluster, "POST", app_path(t["a"]), ranked_app("vip", [job("j0", 2, 10**8)], pc["high"]))
        await wait_for(lambda: (t["a"], "vip") in ctl.need(ctl.arbiter).records, 60, "vip tracked")
        arbiter = ctl.need(ctl.arbiter)
        for _ in range(2):  # two lease ends: each time the pinned App's leases are renewed, not handed on
            before = arbiter.rounds
            clock.advance(101)
            await wait_for(lambda b=before: arbiter.rounds > b, 60, "a round past the lease end")
            assert gpus(cluster, t["a"], "vip") == 0
            assert sum(len(le.gpus) for le in arbiter.records[(t["a"], "pinned")].leases) == 4
        assert not events(cluster, t["a"], "Reclaimed")
        assert not [
            e for e in events(cluster, t["a"], "Preempted") if e["involvedObject"]["name"] == "pinned"
        ]
        await call(cluster, "DELETE", app_path(t["a"], "pinned"))
        await wait_for(
            lambda: cluster.request("GET", app_path(t["a"], "pinned"))[0] == 404, 60, "the pinned App gone"
        )
        clock.advance(101)  # the next lease end brings a round
        await wait_for(lambda: gpus(cluster, t["a"], "vip") == 2, 90, "vip on the GPUs the pinned App left")


async def test_a_borrowing_high_priority_app_takes_gpus_from_a_lower_priority_borrower(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # 4 GPUs; teams A and B guaranteed 1 each, A lending under immediate. A's priority-10 App borrows 3
    # while B is idle. B's priority-1000 App asks for 3: the division gives each team 2. B's guarantee comes
    # from the free GPU; its second GPU is borrowed, and with borrowWithinCohort LowerPriority B takes it at
    # once from A's App (above A's share of 2) instead of waiting for A's lease to end (the clock stands still).
    clock = ManualClock()
    nodes.add(f"{namespace}-n1", gpus=4)
    spec_a = {"guaranteedGPUs": 1, "reclaim": {"mode": "immediate", "checkpointGraceSeconds": 3}}
    spec_b = {"guaranteedGPUs": 1, "preemption": {"borrowWithinCohort": {"policy": "LowerPriority"}}}
    async with (
        priority_classes(cluster, high=1000, low=10) as pc,
        teams(cluster, namespace, a=spec_a, b=spec_b) as t,
        kubelet(cluster, t["a"]) as kl,
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=clock) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        await wait_for(
            lambda: ctl.priority_classes is not None and pc["high"] in ctl.priority_classes,
            60,
            "classes seen",
        )
        three = [job(f"j{i}", 1, 10**8) for i in range(3)]
        await call(cluster, "POST", app_path(t["a"]), ranked_app("bulk", three, pc["low"]))
        await wait_for(lambda: gpus(cluster, t["a"], "bulk") == 3, 90, "A's App borrowing 3 GPUs")
        earlier = set(kl.grace)
        await call(cluster, "POST", app_path(t["b"]), ranked_app("vip", three, pc["high"]))
        await wait_for(
            lambda: (p := app_pods(cluster, t["b"], "vip")) and len(p) == 2 and bound(p),
            120,
            "B's pods bound on the free GPU and one of bulk's",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        await wait_for(lambda: gpus(cluster, t["b"], "vip") == 2, 60, "B's status")
        await wait_for(lambda: gpus(cluster, t["a"], "bulk") == 2, 60, "bulk down to its queue's share")
        reclaimed = await wait_for(lambda: events(cluster, t["a"], "Reclaimed"), 60, "the event on bulk")
        assert any("borrowWithinCohort" in e["message"] for e in reclaimed), reclaimed
        await wait_for(lambda: set(kl.grace) - earlier, 60, "bulk's pod deleted")
        assert {kl.grace[p] for p in set(kl.grace) - earlier} == {3}, kl.grace  # A's checkpoint grace
        # B holds its share: another round takes nothing more (bulk is at A's share).
        arbiter = ctl.need(ctl.arbiter)
        before = arbiter.rounds
        arbiter.dirty = True
        await wait_for(lambda: arbiter.rounds > before, 60, "a round")
        assert gpus(cluster, t["a"], "bulk") == 2 and gpus(cluster, t["b"], "vip") == 2
