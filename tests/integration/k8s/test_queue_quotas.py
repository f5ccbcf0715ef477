"""A Queue's per-model GPU caps and CPU/memory quotas on the real API server (docs/queues.md, "CPU, memory
and per-model quotas"): `maxGPUsByModel` holding an App back while GPUs of the capped model stay free, and
`maxCPU` holding a gated pod back (and an App) while the queue has room for their GPUs, each with its
reason in the Queue's status. The operator runs as the chart's ServiceAccount; kube-scheduler binds pods
through the extender."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .conftest import Credentials, ManualClock, Nodes, Scheduling, wait_for
from .controlplane import ControlPlane
from .test_app import TEMPLATE, app_body, app_path, app_pods, job
from .test_queue_admission import (
    get_pod,
    gpu_pod,
    known,
    queue_admission,  # noqa: F401  (the fixture, used by name)
)
from .test_queues import gpus, queue_status, seen, teams
from .workloads import bound, call, kubelet, operator, scheduling_report


def pending(cluster: ControlPlane, queue: str) -> list[tuple[str, str, int, str]]:
    return [
        (p["kind"], p["name"], p["gpus"], p["reason"])
        for p in queue_status(cluster, queue).get("pending") or []
    ]


def with_cpu(body: dict[str, Any], cpu: str) -> dict[str, Any]:
    """An App whose pods request `cpu` each (its template's container)."""
    body = copy.deepcopy(body)
    template = body["spec"]["template"] = copy.deepcopy(TEMPLATE)
    template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return body


def cpu_pod(name: str, gpus_: int, cpu: str) -> dict[str, Any]:
    body = gpu_pod(name, gpus_)
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    return body


async def test_a_per_model_cap_holds_an_app_back_while_gpus_of_that_model_are_free(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    nodes.add(f"{namespace}-a100", gpus=4, model="A100")
    nodes.add(f"{namespace}-v100", gpus=2, model="V100")
    async with (
        teams(cluster, namespace, a={"maxGPUsByModel": {"A100": 2}}) as t,
        kubelet(cluster, namespace),
        operator(cluster, chart_rbac["operator"], namespace, lease_s=1000.0, clock=ManualClock()) as ctl,
    ):
        await seen(ctl, t, "a")
        queue = t["a.queue"]
        await call(
            cluster,
            "POST",
            app_path(namespace),
            app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(5)]),
        )
        # 2 A100s (its cap) and both V100s; the fifth job waits though 2 A100s are free.
        pods = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "burst")) and len(p) == 4 and bound(p) and p,
            120,
            "4 pods of the App bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        on = sorted(p["spec"]["nodeName"] for p in pods)
        assert on == [f"{namespace}-a100"] * 2 + [f"{namespace}-v100"] * 2
        await wait_for(lambda: gpus(cluster, namespace, "burst") == 4, 60, "the App's status")
        await wait_for(
            lambda: pending(cluster, queue) == [("App", "burst", 1, "QueueModelQuota")], 60, "the reason"
        )
        status = queue_status(cluster, queue)
        assert status["allocatedGPUs"] == 4
        assert status["pending"][0]["message"] == (
            f"queue {queue}'s Apps hold their maxGPUsByModel of every model free now (A100 2 of 2)"
        )
        assert len(app_pods(cluster, namespace, "burst")) == 4  # rounds since granted nothing more
        await call(cluster, "DELETE", app_path(namespace, "burst"))
        await wait_for(
            lambda: not app_pods(cluster, namespace, "burst", live=False), 120, "the App's pods gone"
        )


@pytest.mark.usefixtures("queue_admission")
async def test_a_cpu_quota_holds_a_gated_pod_and_an_app_back_while_gpus_are_free(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    nodes.add(f"{namespace}-n1", gpus=4)
    async with (
        teams(cluster, namespace, a={"maxCPU": "4"}) as t,
        kubelet(cluster, namespace),
        operator(cluster, chart_rbac["operator"], namespace, lease_s=1000.0, clock=ManualClock()) as ctl,
    ):
        await seen(ctl, t, "a")
        queue = t["a.queue"]
        # An App's pod requests 3 of the queue's 4 CPUs.
        await call(
            cluster, "POST", app_path(namespace), with_cpu(app_body("hold", [job("j0", 1, 10**8)]), "3")
        )
        await wait_for(
            lambda: (p := app_pods(cluster, namespace, "hold")) and bound(p),
            120,
            "the App's pod bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        # A pod asking 2 CPUs waits (3 + 2 > 4) though 3 GPUs are free; a later one asking 1 CPU goes.
        await call(cluster, "POST", f"/api/v1/namespaces/{namespace}/pods", cpu_pod("train", 1, "2"))
        await known(ctl, "train")
        await call(cluster, "POST", f"/api/v1/namespaces/{namespace}/pods", cpu_pod("tiny", 1, "1"))
        await known(ctl, "train", "tiny")
        await wait_for(
            lambda: bound([get_pod(cluster, namespace, "tiny")]),
            120,
            "the small pod admitted and bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        status = await wait_for(
            lambda: (
                (s := queue_status(cluster, queue)).get("allocatedByKind", {}).get("pods") == 1
                and [(p["name"], p["reason"]) for p in s.get("pending") or []] == [("train", "QueueCPUQuota")]
                and s
            ),
            60,
            "the pod waiting for CPU in its Queue's status",
        )
        assert status["pending"][0]["message"] == (
            f"Pod train requests 2 CPU; queue {queue}'s pods request 4 CPU of its maxCPU 4"
        )
        assert not get_pod(cluster, namespace, "train")["spec"].get("nodeName")
        # An App whose pod requests 1 CPU gets no GPU either: the queue's pods request all 4.
        await call(
            cluster, "POST", app_path(namespace), with_cpu(app_body("more", [job("j0", 1, 10**8)]), "1")
        )
        await wait_for(
            lambda: ("App", "more", 1, "QueueCPUQuota") in pending(cluster, queue),
            60,
            "the App waiting for CPU",
        )
        assert not app_pods(cluster, namespace, "more")
        # The first App goes: its 3 CPUs let the pod in (and the App after it: 1 + 2 + 1 = 4).
        await call(cluster, "DELETE", app_path(namespace, "hold"))
        await wait_for(
            lambda: bound([get_pod(cluster, namespace, "train")]),
            120,
            "the pod admitted and bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        await wait_for(lambda: (p := app_pods(cluster, namespace, "more")) and bound(p), 120, "the App's pod")
        await call(cluster, "DELETE", app_path(namespace, "more"))
        for name in ("train", "tiny"):
            await call(cluster, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        await wait_for(lambda: not ctl.queued.pods, 60, "the pods gone")
