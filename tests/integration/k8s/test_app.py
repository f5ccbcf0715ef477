"""App end to end on a real control plane: the operator (as the chart's ServiceAccount) creates each job's
pods, the real kube-scheduler binds them through the extender onto fake GPU nodes, the App's status holds
phase, ρ and leases; an expired lease moves a GPU to the App with the worse ρ; deleting the App removes its
pods (ownerReferences, the garbage collector) and the operator's finalizer lets it go."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tessera.api import contract

from .conftest import Credentials, ManualClock, Nodes, Scheduling, wait_for
from .controlplane import ControlPlane
from .workloads import (
    assignment_of,
    bound,
    call,
    cr_path,
    events,
    kubelet,
    operator,
    placement_of,
    pods_with,
    status_of,
)

TEMPLATE = {"spec": {"containers": [{"name": "train", "image": "trainer:1", "command": ["python", "t.py"]}]}}


def app_body(name: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": name},
        "spec": {"template": TEMPLATE, "jobs": jobs},
    }


def job(name: str, gpus: int, iters: int = 1000) -> dict[str, Any]:
    return {"name": name, "iterTotal": iters, "iterTimeSerialSeconds": 1.0, "maxGPUs": gpus}


def app_path(ns: str, name: str = "") -> str:
    return cr_path(contract.PLURAL_APP, ns, name)


def app_status(cluster: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return status_of(cluster, contract.PLURAL_APP, ns, name)


def app_pods(cluster: ControlPlane, ns: str, app: str, *, live: bool = True) -> list[dict[str, Any]]:
    return pods_with(cluster, ns, contract.LABEL_APP, app, live=live)


def plain_gpu_pod(name: str, node: str) -> dict[str, Any]:
    """A pod Tessera's operator did not make that holds a whole GPU, placed by the extender."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {contract.ANN_PLACEMENT: json.dumps({"node": node, "gpuIndices": [0]})},
        },
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {"name": "c", "image": "x:1", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}
            ],
        },
    }


async def test_app_pods_are_bound_through_the_extender_and_status_is_written(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    node = nodes.add(f"{namespace}-n1", gpus=4)
    async with operator(cluster, chart_rbac["operator"], namespace, socket_group=7070):
        await call(cluster, "POST", app_path(namespace), app_body("a", [job("j1", 2), job("j2", 1)]))
        pods = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "a")) and len(p) == 2 and bound(p) and p,
            120,
            "both jobs' pods bound by kube-scheduler",
        )
        st = await wait_for(
            lambda: (s := app_status(cluster, namespace, "a")).get("leases") and s, 60, "the App's status"
        )
        app = cluster.get(app_path(namespace, "a"))
    assert st["phase"] == "Running" and st["gpus"] == 3 and st["rho"] > 0
    assert {j["name"]: j["gpus"] for j in st["jobs"]} == {"j1": 2, "j2": 1}
    leased = {(lease["job"], lease["node"], tuple(lease["gpuIndices"])) for lease in st["leases"]}
    used: set[int] = set()
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        placement, assignment = placement_of(pod), assignment_of(pod)
        # The scheduler bound the pod where the auction put it; the extender assigned exactly those GPUs.
        assert spec["nodeName"] == placement["node"] == assignment["node"] == node
        assert assignment["gpuIndices"] == placement["gpuIndices"]
        assert assignment["gpuUUIDs"] == [f"GPU-{node}-{i}" for i in placement["gpuIndices"]]
        assert (meta["labels"][contract.LABEL_JOB], node, tuple(placement["gpuIndices"])) in leased
        used.update(placement["gpuIndices"])
        assert spec["schedulerName"] == contract.SCHEDULER_NAME
        assert spec["securityContext"]["supplementalGroups"] == [7070]  # the agent's socket group
        assert meta["ownerReferences"][0]["uid"] == app["metadata"]["uid"]
        assert spec["containers"][0]["resources"]["limits"][contract.RESOURCE_GPU] == str(
            len(placement["gpuIndices"])
        )
    assert len(used) == 3


async def test_an_expired_lease_moves_a_gpu_to_the_app_with_worse_rho(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # As tests/integration/operator/test_app.py: n2's GPU is first held by a plain pod, so A leases n1/0
    # and, once that pod is gone, n2/0 ten (manual) seconds later; its two leases expire apart. f = 0: both
    # Apps bid and the auction decides. The kubelet is played: a deleted pod goes once it is Terminating.
    clock = ManualClock()
    n1, n2 = nodes.add(f"{namespace}-n1", gpus=1), nodes.add(f"{namespace}-n2", gpus=1)
    await call(cluster, "POST", f"/api/v1/namespaces/{namespace}/pods", plain_gpu_pod("other", n2))
    await wait_for(
        lambda: bound([cluster.get(f"/api/v1/namespaces/{namespace}/pods/other")]), 120, "other bound"
    )
    async with (
        kubelet(cluster, namespace) as kl,
        operator(cluster, chart_rbac["operator"], namespace, lease_s=100.0, clock=clock, fairness_knob=0.0),
    ):
        await call(cluster, "POST", app_path(namespace), app_body("a", [job("j1", 2, iters=100000)]))
        await wait_for(lambda: app_status(cluster, namespace, "a").get("gpus") == 1, 90, "A on n1")
        clock.advance(10)
        await call(cluster, "DELETE", f"/api/v1/namespaces/{namespace}/pods/other")
        pods = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "a")) and len(p) == 2 and bound(p) and p,
            120,
            "A's gang on n1 and n2, bound",
        )
        assert {p["spec"]["nodeName"] for p in pods} == {n1, n2}
        clock.advance(10)
        await call(cluster, "POST", app_path(namespace), app_body("b", [job("j1", 1, iters=100000)]))
        pending = await wait_for(
            lambda: (s := app_status(cluster, namespace, "b")).get("phase") == "Pending" and s,
            60,
            "B pending",
        )
        rho_a = app_status(cluster, namespace, "a")["rho"]
        assert pending["gpus"] == 0 and pending["rho"] > rho_a  # B, holding nothing, has the worse ρ
        assert not app_pods(cluster, namespace, "b")  # nothing is free before the expiry
        clock.advance(80)  # A's n1 lease expires; n2's has 10 s to run
        (b_pod,) = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "b")) and bound(p) and p, 120, "B's pod bound on n1"
        )
        assert b_pod["spec"]["nodeName"] == n1 and assignment_of(b_pod)["gpuUUIDs"] == [f"GPU-{n1}-0"]
        st_b = await wait_for(
            lambda: (s := app_status(cluster, namespace, "b")).get("gpus") == 1 and s, 60, "B holding n1"
        )
        assert [lease["node"] for lease in st_b["leases"]] == [n1]
        st_a = await wait_for(
            lambda: (s := app_status(cluster, namespace, "a")).get("gpus") == 1 and s, 60, "A down to n2"
        )
        assert [lease["node"] for lease in st_a["leases"]] == [n2]
        (a_pod,) = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "a")) and len(p) == 1 and bound(p) and p,
            120,
            "A's one pod bound on n2",
        )
        assert a_pod["spec"]["nodeName"] == n2
        await wait_for(lambda: events(cluster, namespace, "Preempted"), 60, "a Preempted event")
    # Every pod of A the operator took away was deleted with the preemption grace period (5 s here).
    preempted = {name: g for name, g in kl.grace.items() if name != "other"}
    assert preempted and set(preempted.values()) == {5}
    assert kl.grace["other"] == 30  # the user's delete: the pod's default grace


async def test_deleting_an_app_removes_its_pods_and_the_finalizer_lets_it_go(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    nodes.add(f"{namespace}-n1", gpus=4)
    async with kubelet(cluster, namespace) as kl, operator(cluster, chart_rbac["operator"], namespace):
        for name in ("a", "b"):
            await call(cluster, "POST", app_path(namespace), app_body(name, [job("j1", 2)]))
        for name in ("a", "b"):
            await wait_for(
                lambda n=name: (p := app_pods(cluster, namespace, n)) and bound(p), 120, f"{name}'s pod bound"
            )
        app = cluster.get(app_path(namespace, "a"))
        assert contract.FINALIZER in app["metadata"]["finalizers"]
        pods_a = {p["metadata"]["name"] for p in app_pods(cluster, namespace, "a")}
        pods_b = {p["metadata"]["name"] for p in app_pods(cluster, namespace, "b")}
        # Background (kubectl's default): the App goes once the operator's finalizer is done; its pods are
        # deleted by the operator and, failing that, by the garbage collector.
        await call(cluster, "DELETE", app_path(namespace, "a"))
        # Foreground: the garbage collector deletes the pods (blockOwnerDeletion) and the App stays until
        # they are gone — which needs the kubelet to have stopped them.
        await call(
            cluster,
            "DELETE",
            app_path(namespace, "b"),
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"},
        )
        for name in ("a", "b"):
            await wait_for(
                lambda n=name: cluster.get(app_path(namespace, n)) is None, 120, f"App {name} gone"
            )
        await wait_for(
            lambda: (
                not app_pods(cluster, namespace, "a", live=False)
                and not app_pods(cluster, namespace, "b", live=False)
            ),
            120,
            "every pod of a and b gone",
        )
        # kopf may run the delete handler again on a later event of an App that another finalizer (the
        # foreground one) still holds: one Cleanup event per App at least.
        await wait_for(
            lambda: (
                {e["involvedObject"]["name"] for e in events(cluster, namespace, "Cleanup")} == {"a", "b"}
            ),
            60,
            "a Cleanup event for each App",
        )
    assert pods_a | pods_b <= set(kl.grace)  # each was deleted (not just dropped from a list)


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_apps_whose_status_the_cluster_no_longer_matches_do_not_stall_the_rounds(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # Statuses an earlier operator wrote: X's startTime came from a clock ahead of this operator's, Y holds
    # a lease on a node that has left the cluster. Every round used to raise on them ("time went
    # backwards" from N_avg, "unknown GPU" from Y's bid), so no App got a GPU.
    clock = ManualClock()
    node = nodes.add(f"{namespace}-n1", gpus=2)
    gone = f"{namespace}-gone"
    await call(cluster, "POST", app_path(namespace), app_body("x", [job("j1", 1)]))
    await call(cluster, "POST", app_path(namespace), app_body("y", [job("j1", 2)]))
    merge = {"content_type": "application/merge-patch+json"}
    await call(
        cluster,
        "PATCH",
        app_path(namespace, "x") + "/status",
        {"status": {"startTime": stamp(clock.now + 3600)}},
        **merge,
    )
    lease = {
        "node": gone,
        "gpuIndices": [0],
        "job": "j1",
        "expiresAt": stamp(clock.now + 600),
        "source": "auction",
    }
    await call(
        cluster,
        "PATCH",
        app_path(namespace, "y") + "/status",
        {"status": {"startTime": stamp(clock.now - 60), "leases": [lease]}},
        **merge,
    )
    async with operator(cluster, chart_rbac["operator"], namespace, clock=clock, fairness_knob=0.0):
        (x_pod,) = await wait_for(
            lambda: (p := app_pods(cluster, namespace, "x")) and bound(p) and p, 120, "X's pod bound"
        )
        y_pods = await wait_for(
            lambda: (
                (p := [q for q in app_pods(cluster, namespace, "y") if placement_of(q)["node"] == node])
                and bound(p)
                and p
            ),
            120,
            "Y's pod on the node that is there, bound",
        )
        st = await wait_for(
            lambda: (s := app_status(cluster, namespace, "y")).get("gpus") == 2 and s, 60, "Y's status"
        )
    assert x_pod["spec"]["nodeName"] == node and len(y_pods) == 1
    assert {x["node"] for x in st["leases"]} == {gone, node}  # the lost node's lease runs to its expiry


async def test_apps_and_trialgroups_whose_names_cannot_label_pods_are_refused(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # A valid object name may have 253 characters, a label value 63: the API server refused every pod of
    # such an App (422) while its lease held a GPU nothing could use.
    nodes.add(f"{namespace}-n1", gpus=2)
    name = "a" * 64
    tg = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": name},
        "spec": {"template": TEMPLATE, "trials": [{"name": "t", "budgetIterations": 10}]},
    }
    async with operator(cluster, chart_rbac["operator"], namespace):
        await call(cluster, "POST", app_path(namespace), app_body(name, [job("j1", 1)]))
        await call(cluster, "POST", cr_path(contract.PLURAL_TRIALGROUP, namespace), tg)
        for plural, label in ((contract.PLURAL_APP, "app"), (contract.PLURAL_TRIALGROUP, "trialgroup")):
            st = await wait_for(
                lambda p=plural: (s := status_of(cluster, p, namespace, name)).get("phase") == "Failed" and s,
                60,
                f"the {plural} refused",
            )
            (valid,) = [c for c in st["conditions"] if c["type"] == "Valid"]
            assert valid["status"] == "False" and valid["message"].startswith(
                "metadata.name: must be at most 63"
            )
            assert f"tessera.io/{label} label" in valid["message"] and not st.get("leases")
        refusals = await wait_for(lambda: events(cluster, namespace, "InvalidSpec"), 60, "InvalidSpec events")
        assert all("metadata.name" in e["message"] for e in refusals)
        assert not (cluster.get(f"/api/v1/namespaces/{namespace}/pods") or {}).get("items")
        assert not events(cluster, namespace, "GangFailed")
