"""Pods of other kinds in a team queue on the real API server (docs/queues.md, "Pods and Jobs in a queue").

The chart's queue admission policy (a MutatingAdmissionPolicy, rendered by the real Helm engine and applied as
it is) gates a pod asking for tessera.io/gpu in a namespace labelled with a queue; the operator, as the
chart's ServiceAccount, takes the gate off once the queue has room, and kube-scheduler binds the pod through
the extender. A batch/v1 Job's pods are made by the control plane's own Job controller (kube-controller-
manager runs every controller but node IPAM, node lifecycle and TTL here) and admitted together.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tessera.api import contract

from .conftest import (
    Credentials,
    ManualClock,
    Nodes,
    Scheduling,
    queue_admission_objects,
    wait_for,
)
from .controlplane import ControlPlane, wait_until
from .test_app import app_body, app_path, app_pods, job
from .test_queues import queue_status, seen, teams
from .workloads import bound, call, events, kubelet, operator, scheduling_report

GATE = {"name": contract.SCHEDULING_GATE_QUEUE}


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {"name": "c", "image": "x:1", "resources": {"limits": {contract.RESOURCE_GPU: str(gpus)}}}
            ],
        },
    }


def gated(pod: dict[str, Any]) -> bool:
    return GATE in (pod["spec"].get("schedulingGates") or [])


def get_pod(cluster: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return dict(cluster.get(f"/api/v1/namespaces/{ns}/pods/{name}") or {})


def scheduling_gated(pod: dict[str, Any]) -> bool:
    """Pending with PodScheduled False, reason SchedulingGated (what `kubectl get pods` shows)."""
    conds = pod.get("status", {}).get("conditions") or []
    return pod["status"].get("phase") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conds
    )


@pytest.fixture(scope="module")
def queue_admission(cluster: ControlPlane) -> Iterator[list[dict[str, Any]]]:
    """The chart's queue admission policy applied as rendered (default values), once the API server enforces
    it (policies load through an informer); removed afterwards."""
    objs = queue_admission_objects()
    assert {o["kind"] for o in objs} == {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    manifest = "\n---\n".join(yaml.safe_dump(o) for o in objs)
    applied = cluster.kubectl("apply", "-f", "-", stdin=manifest, check=False)
    assert applied.returncode == 0, applied.stderr
    probe = f"probe-{secrets.token_hex(4)}"
    status, body = cluster.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": probe, "labels": {contract.LABEL_QUEUE: "probe"}}}
    )
    assert status == 201, body

    def enforced() -> bool:
        status, out = cluster.request("POST", f"/api/v1/namespaces/{probe}/pods?dryRun=All", gpu_pod("p", 1))
        return status == 201 and gated(out)

    try:
        wait_until(enforced, 120, "the chart's queue admission policy to take effect")
        yield objs
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{probe}")
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifest)


async def known(ctl: Any, *names: str) -> None:
    """The operator's pod watch has the pods; then one admission pass (what their events start anyway)
    runs with all of them known."""
    await wait_for(lambda: {k[1] for k in ctl.queued.pods} >= set(names), 60, f"pods {names} seen")
    n = ctl.gate.passes
    await ctl.admit()
    await wait_for(lambda: ctl.gate.passes > n, 60, "an admission pass")


async def test_a_plain_pod_waits_while_its_queue_is_full_and_runs_once_room_frees(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
    queue_admission: list[dict[str, Any]],
) -> None:
    nodes.add(f"{namespace}-n1", gpus=4)
    async with (
        teams(cluster, namespace, a={"guaranteedGPUs": 2, "maxGPUs": 2}) as t,
        kubelet(cluster, namespace),
        operator(cluster, chart_rbac["operator"], namespace, lease_s=1000.0, clock=ManualClock()) as ctl,
    ):
        await seen(ctl, t, "a")
        queue = t["a.queue"]
        # An App takes the queue's maximum; its pods are the operator's and pass ungated.
        await call(cluster, "POST", app_path(namespace), app_body("hold", [job("j0", 2, 10**8)]))
        held = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "hold")) and bound(p) and p,
            120,
            "the App's pod bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        assert not any(gated(p) for p in held)
        created = await call(cluster, "POST", f"/api/v1/namespaces/{namespace}/pods", gpu_pod("train", 2))
        assert gated(created) and created["metadata"]["labels"][contract.LABEL_QUEUED] == "true"
        # More than the queue may ever hold: told why, once, and not counted as waiting.
        await call(cluster, "POST", f"/api/v1/namespaces/{namespace}/pods", gpu_pod("huge", 3))
        await known(ctl, "train", "huge")
        too_big = await wait_for(lambda: events(cluster, namespace, "QueueTooSmall"), 60, "the warning")
        assert [e["involvedObject"]["name"] for e in too_big] == ["huge"]
        assert "maxGPUs of 2" in too_big[0]["message"]
        assert ctl.queue_outside_waiting().get(queue) == 2.0
        assert sorted(ctl.gate.pending[queue]) == [
            (f"Pod/{namespace}/huge", 3, "Pod/huge asks for 3 GPUs, more than its queue's maxGPUs of 2"),
            (f"Pod/{namespace}/train", 2, "its queue has room for 0 of its 2 GPUs"),
        ]
        pod = await wait_for(
            lambda: scheduling_gated(p := get_pod(cluster, namespace, "train")) and p, 60, "gated"
        )
        assert gated(pod) and not pod["spec"].get("nodeName")
        # The Queue's status lists the waiting pod, and why (the one that can never fit is not waiting).
        status = await wait_for(
            lambda: (s := queue_status(cluster, queue)).get("waitingByKind", {}).get("pods") == 1 and s,
            60,
            "the pod in its Queue's status",
        )
        assert [(e["kind"], e["name"], e["gpus"], e["reason"]) for e in status["pending"]] == [
            ("Pod", "train", 2, "QueueAtMax")
        ]
        assert status["allocatedByKind"]["apps"] == 2 and status["allocatedByKind"]["pods"] == 0
        # The App goes: its GPUs are the pod's.
        await call(cluster, "DELETE", app_path(namespace, "hold"))
        await wait_for(
            lambda: bound([get_pod(cluster, namespace, "train")]),
            120,
            "the pod admitted and bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        admitted = events(cluster, namespace, "Admitted")
        assert [e["message"] for e in admitted if e["involvedObject"]["name"] == "train"] == [
            f"queue {queue} has room for 2 GPU(s) of the pod"
        ]
        # Now the queue's holding (never reclaimed), and nothing of it waits.
        assert ctl.queue_outside().get(queue) == 2.0
        assert queue not in ctl.queue_outside_waiting()
        status = await wait_for(
            lambda: (s := queue_status(cluster, queue)).get("allocatedByKind", {}).get("pods") == 2 and s,
            60,
            "the admitted pod counted in its Queue's status",
        )
        assert status["allocatedGPUs"] == 2 and status["waiting"] == 0 and not status.get("pending")
        assert gated(get_pod(cluster, namespace, "huge"))
        # Gone before the operator stops: the next test's operator watches every namespace.
        for name in ("train", "huge"):
            await call(cluster, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        await wait_for(lambda: not ctl.queued.pods, 60, "the pods gone")


def gpu_job(name: str, parallelism: int, gpus: int) -> dict[str, Any]:
    pod = gpu_pod("", gpus)
    pod["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "template": {"spec": pod["spec"]},
        },
    }


def job_pods(cluster: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    got = cluster.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={contract.LABEL_JOB_NAME}%3D{name}") or {}
    return list(got.get("items") or [])


async def test_a_jobs_pods_are_admitted_together_or_not_at_all(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
    queue_admission: list[dict[str, Any]],
) -> None:
    nodes.add(f"{namespace}-n1", gpus=4)
    async with (
        teams(cluster, namespace, a={"guaranteedGPUs": 3, "maxGPUs": 3}) as t,
        kubelet(cluster, namespace),
        operator(cluster, chart_rbac["operator"], namespace, lease_s=1000.0, clock=ManualClock()) as ctl,
    ):
        await seen(ctl, t, "a")
        await call(cluster, "POST", app_path(namespace), app_body("hold", [job("j0", 2, 10**8)]))
        await wait_for(lambda: (p := app_pods(cluster, namespace, "hold")) and bound(p), 120, "the App bound")
        # Room for 1 GPU of the queue's 3; the Job wants 2 pods of 1 GPU: neither goes.
        await call(cluster, "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", gpu_job("sweep", 2, 1))
        pods = await wait_for(
            lambda: len(p := job_pods(cluster, namespace, "sweep")) == 2 and p, 60, "2 pods"
        )
        assert all(gated(p) for p in pods)
        await known(ctl, *(p["metadata"]["name"] for p in pods))
        assert all(gated(p) for p in job_pods(cluster, namespace, "sweep"))
        assert ctl.queue_outside_waiting().get(t["a.queue"]) == 2.0
        await call(cluster, "DELETE", app_path(namespace, "hold"))
        await wait_for(
            lambda: (p := job_pods(cluster, namespace, "sweep")) and len(p) == 2 and bound(p),
            120,
            "both pods admitted and bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        admitted = {
            e["involvedObject"]["name"]
            for e in events(cluster, namespace, "Admitted")
            if e["involvedObject"]["kind"] == "Pod"
        }
        assert admitted == {p["metadata"]["name"] for p in job_pods(cluster, namespace, "sweep")}
        assert ctl.queue_outside().get(t["a.queue"]) == 2.0
        jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        await call(cluster, "DELETE", f"{jobs}/sweep?propagationPolicy=Background")
        await wait_for(lambda: not ctl.queued.pods, 60, "the Job's pods gone")


def test_pods_of_namespaces_without_a_queue_and_the_operators_own_are_not_gated(
    cluster: ControlPlane, namespace: str, queue_admission: list[dict[str, Any]]
) -> None:
    status, out = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", gpu_pod("p", 1))
    assert status == 201 and not gated(out) and contract.LABEL_QUEUED not in out["metadata"].get("labels", {})
    labelled = f"q-{secrets.token_hex(4)}"
    status, body = cluster.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": labelled, "labels": {contract.LABEL_QUEUE: "x"}}}
    )
    assert status == 201, body
    try:
        path = f"/api/v1/namespaces/{labelled}/pods?dryRun=All"
        # CPU only; another scheduler's; a DaemonSet's; the operator's own: none waits in the queue.
        cpu = gpu_pod("cpu", 1)
        del cpu["spec"]["containers"][0]["resources"]
        other = gpu_pod("volcano", 1)
        other["spec"]["schedulerName"] = "volcano"
        ds = gpu_pod("ds", 1)
        ds["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": "d",
                "uid": "00000000-0000-0000-0000-000000000001",
            }
        ]
        own = gpu_pod("own", 1)
        own["metadata"]["labels"] = {
            contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
            contract.LABEL_APP: "train",
        }
        # A pod asking for its GPU through a claim (DRA lanes): team queues do not count claims (docs/dra.md).
        dra = gpu_pod("dra", 1)
        dra["spec"]["schedulerName"] = "default-scheduler"
        dra["spec"]["resourceClaims"] = [{"name": "lane", "resourceClaimTemplateName": "lane-30"}]
        dra["spec"]["containers"][0]["resources"] = {"claims": [{"name": "lane"}]}
        for body in (cpu, other, ds, own, dra):
            status, out = cluster.request("POST", path, body)
            assert status == 201 and not gated(out), (body["metadata"]["name"], out)
        # A pod of its own gates keeps them beside the queue's.
        mine = gpu_pod("mine", 1)
        mine["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
        mine["metadata"]["labels"] = {"team": "vision"}
        status, out = cluster.request("POST", path, mine)
        assert status == 201 and out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, GATE]
        assert out["metadata"]["labels"] == {"team": "vision", contract.LABEL_QUEUED: "true"}
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{labelled}")


async def test_a_gated_pod_within_its_guarantee_gets_gpus_back_from_a_borrower(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
    queue_admission: list[dict[str, Any]],
) -> None:
    """A gated pod is work waiting in its queue like a TrialGroup: B, lending under `immediate`, gives the
    GPUs it borrowed from A back at once (no lease ends: the clock stands still), and they go to the pod,
    not to B's App again. The pod stays gated until they are free."""
    nodes.add(f"{namespace}-n1", gpus=4)
    lender = {"guaranteedGPUs": 2, "reclaim": {"mode": "immediate", "checkpointGraceSeconds": 1}}
    async with (
        teams(cluster, namespace, a={"guaranteedGPUs": 2}, b=lender) as t,
        kubelet(cluster, t["a"]),
        kubelet(cluster, t["b"]),
        operator(cluster, chart_rbac["operator"], t["a"], lease_s=1000.0, clock=ManualClock()) as ctl,
    ):
        await seen(ctl, t, "a", "b")
        burst = app_body("burst", [job(f"j{i}", 1, 10**8) for i in range(4)])
        await call(cluster, "POST", app_path(t["b"]), burst)
        await wait_for(
            lambda: len(p := app_pods(cluster, t["b"], "burst")) == 4 and bound(p), 120, "B on all 4 GPUs"
        )
        await call(cluster, "POST", f"/api/v1/namespaces/{t['a']}/pods", gpu_pod("train", 2))
        await wait_for(
            lambda: bound([get_pod(cluster, t["a"], "train")]),
            120,
            "the pod admitted and bound on GPUs taken back from B",
            lambda: scheduling_report(cluster, t["a"], t["b"], scheduling=scheduling),
        )
        assert len(app_pods(cluster, t["b"], "burst")) == 2
        assert events(cluster, t["b"], "Reclaimed")
        await call(cluster, "DELETE", f"/api/v1/namespaces/{t['a']}/pods/train")
        await wait_for(lambda: not ctl.queued.pods, 60, "the pod gone")
