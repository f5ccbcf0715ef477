"""The real Kueue admits batch/v1 Jobs asking for `tessera.io/gpu` by its quotas, on kwok GPU nodes.

Kueue (hack/kueue-assets.sh) runs beside the test control plane with its own CRDs and webhooks
(harness.py); kube-scheduler binds the pods of the Jobs it admits to two kwok nodes of 4 `tessera.io/gpu`,
and kwok runs them. One ClusterQueue alone: a Job within its quota is admitted (unsuspended, its Workload
Admitted), one past it waits (its Workload's QuotaReserved False, with Kueue's reason) until the first has
finished. Two ClusterQueues in a cohort: one borrows the other's unused quota up to its borrowingLimit and
no further, and the lender still gets what the cohort has left. These are the objects and conditions the
comparison of Tessera's team queues with Kueue will read.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, cast

from tessera.api import contract

from tests.integration.k8s.controlplane import ControlPlane, Process, wait_until
from tests.integration.kwok.harness import ANN_DURATION

from .harness import API, GROUP, QUEUE_LABEL, VERSION, Kueue

GPU = contract.RESOURCE_GPU
T = TypeVar("T")
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _create(cluster: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, out = cluster.request("POST", path, body)
    assert status == 201, f"creating {body['kind']} {body['metadata']['name']}: {status} {str(out)[:800]}"
    return dict(out)


def _flavor(cluster: ControlPlane, name: str) -> None:
    _create(
        cluster,
        f"{API}/resourceflavors",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": {},
        },
    )


def _cluster_queue(
    cluster: ControlPlane,
    name: str,
    flavor: str,
    gpus: int,
    *,
    cohort: str | None = None,
    borrow: int | None = None,
) -> None:
    """A ClusterQueue of `gpus` nominal `tessera.io/gpu` (CPU and memory plenty), in `cohort` if given,
    borrowing at most `borrow` GPUs from it if given; for every namespace."""
    gpu: dict[str, Any] = {"name": GPU, "nominalQuota": gpus}
    if borrow is not None:
        gpu["borrowingLimit"] = borrow
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", GPU],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": "64"},
                            {"name": "memory", "nominalQuota": "256Gi"},
                            gpu,
                        ],
                    }
                ],
            }
        ],
    }
    if cohort is not None:
        spec["cohortName"] = cohort
    _create(
        cluster,
        f"{API}/clusterqueues",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def _local_queue(cluster: ControlPlane, namespace: str, name: str, cluster_queue: str) -> None:
    _create(
        cluster,
        f"{API}/namespaces/{namespace}/localqueues",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": cluster_queue},
        },
    )


def _job(
    name: str, queue: str, gpus: int, *, duration_s: int | None = None, suspend: bool = True
) -> dict[str, Any]:
    """A one-pod Job in LocalQueue `queue` asking `gpus` `tessera.io/gpu`; its pod runs `duration_s` on kwok
    (until deleted when None)."""
    annotations = {ANN_DURATION: str(duration_s)} if duration_s is not None else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "suspend": suspend,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": "x",
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "1Gi", GPU: str(gpus)},
                                "limits": {GPU: str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def _workload(cluster: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the `kind` object `name` (its owner)."""
    for w in (cluster.get(f"{API}/namespaces/{namespace}/workloads") or {}).get("items") or []:
        if any(o["kind"] == kind and o["name"] == name for o in w["metadata"].get("ownerReferences") or []):
            return dict(w)
    return None


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def _admitted(cluster: ControlPlane, namespace: str, job: str) -> dict[str, Any] | None:
    """The Job's Workload once Admitted and the Job unsuspended by Kueue; None before."""
    wl = _workload(cluster, namespace, "Job", job)
    admitted = _condition(wl, "Admitted")
    if not admitted or admitted["status"] != "True":
        return None
    body = cluster.get(f"{JOBS.format(ns=namespace)}/{job}") or {}
    return wl if body.get("spec", {}).get("suspend") is False else None


def _pending(cluster: ControlPlane, namespace: str, job: str) -> dict[str, Any] | None:
    """The Job's Workload once Kueue has tried and failed to reserve quota for it; None before."""
    wl = _workload(cluster, namespace, "Job", job)
    reserved = _condition(wl, "QuotaReserved")
    return wl if reserved and reserved["status"] == "False" and reserved.get("reason") else None


def _state(cluster: ControlPlane, namespace: str) -> str:
    """Each Workload of `namespace` with its conditions (what a failed wait shows)."""
    lines = []
    for w in (cluster.get(f"{API}/namespaces/{namespace}/workloads") or {}).get("items") or []:
        conds = [
            f"{c['type']}={c['status']}({c.get('reason')}: {c.get('message', '')[:160]})"
            for c in (w.get("status") or {}).get("conditions") or []
        ]
        lines.append(f"  {w['metadata']['name']}: {'; '.join(conds) or 'no conditions'}")
    return "\n".join(lines) or "  no Workloads"


def _wait(
    cluster: ControlPlane,
    kueue: Kueue,
    namespace: str,
    check: Callable[[], T | None],
    timeout: float,
    what: str,
) -> T:
    """wait_until, failing at once if Kueue exits; on a timeout the Workloads as they are then, and Kueue's
    log tail."""
    try:
        return cast(T, wait_until(check, timeout, what, kueue.process))
    except TimeoutError as err:
        raise AssertionError(f"{err}\nWorkloads in {namespace} now:\n{_state(cluster, namespace)}") from None


def _still_pending(cluster: ControlPlane, namespace: str, job: str) -> None:
    wl = _pending(cluster, namespace, job)
    assert wl is not None, f"{job} is no longer pending:\n{_state(cluster, namespace)}"
    admitted = _condition(wl, "Admitted")
    assert admitted is None or admitted["status"] == "False", admitted
    body = cluster.get(f"{JOBS.format(ns=namespace)}/{job}")
    assert body["spec"]["suspend"] is True, f"{job} was unsuspended while over quota"


def test_a_job_within_quota_is_admitted_and_one_past_it_waits_for_quota(
    cluster: ControlPlane, gpu_nodes: list[str], scheduler: Process, kueue: Kueue, queued: str
) -> None:
    suffix = secrets.token_hex(3)
    flavor, cq = f"gpu-{suffix}", f"solo-{suffix}"
    _flavor(cluster, flavor)
    _cluster_queue(cluster, cq, flavor, gpus=4)
    _local_queue(cluster, queued, "solo", cq)
    # Read at v1beta1, the ClusterQueue goes through the CRD's conversion webhook (Kueue's, like the others).
    old = cluster.get(f"/apis/{GROUP}/v1beta1/clusterqueues/{cq}")
    assert old and old["apiVersion"] == f"{GROUP}/v1beta1", old

    # 3 of the queue's 4 GPUs, for 3 s once running on a kwok node.
    _create(cluster, JOBS.format(ns=queued), _job("first", "solo", 3, duration_s=3))
    first = _wait(
        cluster, kueue, queued, lambda: _admitted(cluster, queued, "first"), 60, "Kueue to admit `first`"
    )
    assert first["spec"]["queueName"] == "solo"
    assert first["status"]["admission"]["clusterQueue"] == cq
    (podset,) = first["status"]["admission"]["podSetAssignments"]
    assert podset["flavors"][GPU] == flavor
    assert podset["resourceUsage"][GPU] == "3"

    # 2 more would pass the quota. Created unsuspended: Kueue's job webhook suspends it at creation.
    second = _create(cluster, JOBS.format(ns=queued), _job("second", "solo", 2, duration_s=1, suspend=False))
    assert second["spec"]["suspend"] is True, "Kueue's mutating webhook did not suspend a queued Job"
    wl = _wait(
        cluster,
        kueue,
        queued,
        lambda: _pending(cluster, queued, "second"),
        60,
        "Kueue to find no quota for `second`",
    )
    reserved = _condition(wl, "QuotaReserved")
    assert reserved is not None
    assert reserved["reason"] == "Pending", reserved
    assert f"insufficient unused quota for {GPU} in flavor {flavor}, 1 more needed" in reserved["message"], (
        reserved
    )
    _still_pending(cluster, queued, "second")

    # `first` runs on a kwok node, succeeds, and its quota goes to `second`.
    done = _wait(
        cluster,
        kueue,
        queued,
        lambda: _admitted(cluster, queued, "second"),
        90,
        "`first` to finish and Kueue to admit `second`",
    )
    (pod,) = (cluster.get(f"/api/v1/namespaces/{queued}/pods?labelSelector=job-name%3Dfirst") or {})["items"]
    assert pod["spec"]["nodeName"] in gpu_nodes
    finished = _condition(_workload(cluster, queued, "Job", "first"), "Finished")
    assert finished is not None and finished["status"] == "True", finished
    admitted = _condition(done, "Admitted")
    assert admitted is not None
    assert _time(admitted["lastTransitionTime"]) >= _time(finished["lastTransitionTime"]) - 1


def test_a_cluster_queue_borrows_from_its_cohort_up_to_its_borrowing_limit(
    cluster: ControlPlane, gpu_nodes: list[str], scheduler: Process, kueue: Kueue, queued: str
) -> None:
    suffix = secrets.token_hex(3)
    flavor, cohort, team_a, team_b = f"gpu-{suffix}", f"cohort-{suffix}", f"a-{suffix}", f"b-{suffix}"
    _flavor(cluster, flavor)
    # team-a: 2 GPUs of its own and may borrow 2 more; team-b: 4, none of them used at first. 6 in the cohort.
    _cluster_queue(cluster, team_a, flavor, gpus=2, cohort=cohort, borrow=2)
    _cluster_queue(cluster, team_b, flavor, gpus=4, cohort=cohort)
    _local_queue(cluster, queued, "a", team_a)
    _local_queue(cluster, queued, "b", team_b)

    # 3 GPUs in team-a: 1 borrowed from team-b.
    _create(cluster, JOBS.format(ns=queued), _job("a1", "a", 3))
    _wait(cluster, kueue, queued, lambda: _admitted(cluster, queued, "a1"), 60, "Kueue to admit `a1`")

    def usage() -> dict[str, Any] | None:
        """team-a's use of `tessera.io/gpu` once it counts a1's 3 GPUs (ClusterQueue status)."""
        status = (cluster.get(f"{API}/clusterqueues/{team_a}") or {}).get("status") or {}
        for fl in status.get("flavorsUsage") or []:
            for res in fl["resources"]:
                if res["name"] == GPU and res.get("total") == "3":
                    return dict(res)
        return None

    used = _wait(cluster, kueue, queued, usage, 30, "team-a's status to count 3 GPUs in use")
    assert used.get("borrowed") == "1", used

    # 2 more in team-a would borrow 3: past its limit, though the cohort has 3 free. It waits.
    _create(cluster, JOBS.format(ns=queued), _job("a2", "a", 2))
    wl = _wait(cluster, kueue, queued, lambda: _pending(cluster, queued, "a2"), 60, "Kueue to hold `a2` back")
    reserved = _condition(wl, "QuotaReserved")
    assert reserved is not None and reserved["reason"] == "Pending", reserved
    # It may use 1 more GPU (2 + 2 - 3), not the 3 the cohort has free.
    assert f"insufficient unused quota for {GPU} in flavor {flavor}, 1 more needed" in reserved["message"], (
        reserved
    )

    # team-b still gets the cohort's other 3 (its 4 less the 1 lent).
    _create(cluster, JOBS.format(ns=queued), _job("b1", "b", 3))
    _wait(cluster, kueue, queued, lambda: _admitted(cluster, queued, "b1"), 60, "Kueue to admit `b1`")
    _still_pending(cluster, queued, "a2")

    # The admitted Jobs' pods are bound to the kwok nodes and run there.
    def running() -> bool:
        pods = (cluster.get(f"/api/v1/namespaces/{queued}/pods") or {}).get("items") or []
        phases = {p["metadata"]["labels"].get("job-name"): p["status"].get("phase") for p in pods}
        return phases.get("a1") == "Running" and phases.get("b1") == "Running" and "a2" not in phases

    _wait(cluster, kueue, queued, running, 60, "the pods of a1 and b1 to run on kwok nodes (and none of a2)")


def test_a_plain_pod_is_gated_until_kueue_admits_it(
    cluster: ControlPlane, gpu_nodes: list[str], scheduler: Process, kueue: Kueue, queued: str
) -> None:
    suffix = secrets.token_hex(3)
    flavor, cq = f"gpu-{suffix}", f"pods-{suffix}"
    _flavor(cluster, flavor)
    _cluster_queue(cluster, cq, flavor, gpus=1)
    _local_queue(cluster, queued, "pods", cq)

    def pod(name: str) -> dict[str, Any]:
        job = _job(name, "pods", 1)
        spec = job["spec"]["template"]["spec"]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: "pods"}},
            "spec": spec,
        }

    # Kueue's pod webhook gates each queued pod; the one within quota is ungated and runs, the other stays gated.
    for name in ("p1", "p2"):
        created = _create(cluster, f"/api/v1/namespaces/{queued}/pods", pod(name))
        gates = [g["name"] for g in created["spec"].get("schedulingGates") or []]
        assert f"{GROUP}/admission" in gates, created["spec"]

    def one_runs() -> tuple[dict[str, Any], dict[str, Any]] | None:
        pods = {
            p["metadata"]["name"]: p
            for p in (cluster.get(f"/api/v1/namespaces/{queued}/pods") or {})["items"]
        }
        running = [p for p in pods.values() if p["status"].get("phase") == "Running"]
        gated = [p for p in pods.values() if p["spec"].get("schedulingGates")]
        return (running[0], gated[0]) if len(running) == 1 and len(gated) == 1 else None

    runs, gated = _wait(cluster, kueue, queued, one_runs, 60, "one pod to run and one to stay gated")
    assert runs["spec"]["nodeName"] in gpu_nodes
    waiting = _workload(cluster, queued, "Pod", gated["metadata"]["name"])
    reserved = _condition(waiting, "QuotaReserved")
    assert reserved is not None and reserved["status"] == "False" and reserved["reason"] == "Pending", (
        reserved
    )
