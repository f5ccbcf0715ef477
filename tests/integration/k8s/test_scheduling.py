"""The extender under the real kube-scheduler: pods with schedulerName tessera-scheduler are filtered,
scored and bound through the extender, which writes each pod's lane assignment."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.api.gpu_inventory import parse_node_gpus

from tests.ports import free_port

from .conftest import TESSERA, Credentials, Nodes, Scheduling
from .controlplane import ControlPlane, wait_until

MIB = 1 << 20


def fractional_pod(name: str, memory: str, compute: int) -> dict[str, Any]:
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: memory,
        contract.RESOURCE_GPU_COMPUTE: str(compute),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [{"name": "c", "image": "trainer:1", "resources": {"limits": limits}}],
        },
    }


def create(cluster: ControlPlane, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    status, body = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert status == 201, body
    return dict(body)


def bound_pods(cluster: ControlPlane, namespace: str, count: int) -> list[dict[str, Any]] | None:
    """The namespace's pods once `count` of them are bound (spec.nodeName set), else None."""
    items = cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    bound = [p for p in items if p["spec"].get("nodeName")]
    return bound if len(bound) >= count else None


def bound_pod(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return dict(pod) if pod and pod["spec"].get("nodeName") else None


def unschedulable(cluster: ControlPlane, namespace: str, name: str) -> str | None:
    """The scheduler's message on the pod's PodScheduled=False/Unschedulable condition, once it has one."""
    pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def assignment_of(pod: dict[str, Any]) -> Assignment:
    return Assignment.parse(
        pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT], where=pod["metadata"]["name"]
    )


def test_a_fractional_pod_is_bound_with_its_lane(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    nodes.add("sched-a", gpus=2, memory_mib=16384)
    create(cluster, namespace, fractional_pod("p", "4Gi", 25))
    pod = wait_until(
        lambda: bound_pod(cluster, namespace, "p"), 90, "the pod to be bound", scheduling.scheduler
    )
    assert pod["spec"]["nodeName"] == "sched-a"
    assignment = json.loads(pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert assignment["node"] == "sched-a"


def test_quantities_as_users_write_them(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    """`16Gi` is 16384 MiB (bytes, binary suffix) and `8000`, which the API server returns as `8k`, is 8000
    MiB: both are read so through the real scheduler, and cannot share one 16384 MiB GPU."""
    nodes.add("sched-q", gpus=2, memory_mib=16384, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    stored = {
        "whole": create(cluster, namespace, fractional_pod("whole", "16Gi", 50)),
        "plain": create(cluster, namespace, fractional_pod("plain", "8000", 25)),
    }
    limits = {n: p["spec"]["containers"][0]["resources"]["limits"] for n, p in stored.items()}
    assert limits["whole"][contract.RESOURCE_GPU_MEMORY] == "16Gi"
    assert limits["plain"][contract.RESOURCE_GPU_MEMORY] == "8k"  # the server's canonical form

    pods = wait_until(lambda: bound_pods(cluster, namespace, 2), 90, "both pods bound", scheduling.scheduler)
    got = {p["metadata"]["name"]: assignment_of(p) for p in pods}
    assert (got["whole"].memory_mib, got["whole"].compute_percent) == (16384, 50)
    assert (got["plain"].memory_mib, got["plain"].compute_percent) == (8000, 25)
    assert {got["whole"].node, got["plain"].node} == {"sched-q"}
    assert got["whole"].gpu_uuids != got["plain"].gpu_uuids


def test_an_absurd_quantity_stays_pending_with_the_reason(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    """`1e999` MiB is refused on every node with the reason (it used to overflow into an HTTP 500)."""
    nodes.add("sched-x", gpus=2, memory_mib=16384, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    create(cluster, namespace, fractional_pod("absurd", "1e999", 25))
    message = wait_until(
        lambda: unschedulable(cluster, namespace, "absurd"),
        90,
        "the pod marked unschedulable",
        scheduling.scheduler,
    )
    assert f"{contract.RESOURCE_GPU_MEMORY} '1e999' is more than 16777216 MiB" in message, message
    pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/absurd")
    assert not pod["spec"].get("nodeName")
    assert contract.ANN_ASSIGNMENT not in (pod["metadata"].get("annotations") or {})


def test_a_deleted_pod_gives_its_gpu_back_through_the_watch(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    """The extender's view follows pods created and deleted after it started (its list+watch, not its own
    binds): a pod that waits for a full GPU is bound once the holder is deleted, into the freed memory."""
    node = nodes.add(
        f"{namespace}-one", gpus=1, memory_mib=16384, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU
    )
    create(cluster, namespace, fractional_pod("holder", "12Gi", 50))
    wait_until(lambda: bound_pods(cluster, namespace, 1), 90, "the holder bound", scheduling.scheduler)
    create(cluster, namespace, fractional_pod("waiter", "12Gi", 50))
    message = wait_until(
        lambda: unschedulable(cluster, namespace, "waiter"), 90, "the waiter refused", scheduling.scheduler
    )
    assert "4096 MiB free, pod needs 12288" in message, message

    status, body = cluster.request(
        "DELETE", f"/api/v1/namespaces/{namespace}/pods/holder", {"gracePeriodSeconds": 0}
    )
    assert status == 200, body
    waiter = wait_until(
        lambda: bound_pod(cluster, namespace, "waiter"), 120, "the waiter bound", scheduling.scheduler
    )
    a = assignment_of(waiter)
    assert (a.node, a.gpu_indices, a.memory_mib) == (node, [0], 12288)
    # The extender asked kube-scheduler to retry the refused waiter once its view freed the GPU (its patch,
    # under the scheduler's ServiceAccount), rather than leave it to whichever cluster event came next.
    retry = wait_until(
        lambda: (
            ((cluster.get(f"/api/v1/namespaces/{namespace}/pods/waiter") or {}).get("metadata") or {})
            .get("annotations", {})
            .get(contract.ANN_RETRY)
        ),
        60,
        "the extender's retry of the waiter",
        scheduling.extender,
    )
    assert retry.startswith(f"{node} "), retry


# 200 fractional pods on 20 nodes of 6 GPUs: memory as users write it (the server returns 3000 as `3k`, 4000 as
# `4k`), every (memory, compute) pair 8 times.
NODES, GPUS_PER_NODE, GPU_MIB = 20, 6, 16384
MEMORY = {"2Gi": 2048, "3000": 3000, "2560Mi": 2560, "4000": 4000, "4Gi": 4096}
COMPUTE = (5, 10, 15, 20, 30)
PODS = 200


def workload() -> list[tuple[str, str, int, int]]:
    """(name, memory as written, MiB, compute percent) per pod."""
    memory = list(MEMORY.items())
    return [(f"w{i:03d}", memory[i % 5][0], memory[i % 5][1], COMPUTE[(i // 5) % 5]) for i in range(PODS)]


def test_two_hundred_fractional_pods_never_oversubscribe_a_gpu(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    """Every pod is bound (see below why all must fit), each where its assignment says, on that node's GPUs,
    with no GPU's memory or compute oversubscribed — all read back from the API server."""
    pods = workload()
    # A pod of at most m MiB and c% fails on a GPU only if it has more than G - m MiB or 100 - c% in use. Were
    # it refused on all n GPUs, a of them would hold > G - m MiB and n - a > 100 - c%, so n < M / (G - m) +
    # C / (100 - c) for the other pods' total memory M and compute C. This workload is far from that, and a
    # GPU holds at most G / 2048 = 8 pods, within its tessera.io/gpu slots: all must be bound.
    m, c = max(MEMORY.values()), max(COMPUTE)
    need = sum(p[2] for p in pods) / (GPU_MIB - m) + sum(p[3] for p in pods) / (100 - c)
    assert need < NODES * GPUS_PER_NODE
    assert GPU_MIB // min(MEMORY.values()) <= contract.DEFAULT_SLOTS_PER_GPU

    names = [f"{namespace}-n{i:02d}" for i in range(NODES)]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: nodes.add(
                    n, gpus=GPUS_PER_NODE, memory_mib=GPU_MIB, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU
                ),
                names,
            )
        )
        list(pool.map(lambda p: create(cluster, namespace, fractional_pod(p[0], p[1], p[3])), pods))

    # Everything below is read back from the API server: pods, their assignments, the nodes' inventories.
    bound = wait_until(
        lambda: bound_pods(cluster, namespace, PODS), 180, f"{PODS} pods bound", scheduling.scheduler
    )
    inventory = {
        n: parse_node_gpus(
            cluster.get(f"/api/v1/nodes/{n}")["metadata"]["annotations"][contract.ANN_NODE_GPUS]
        )
        for n in names
    }
    expected = {name: (mib, compute) for name, _, mib, compute in pods}
    memory: dict[str, int] = defaultdict(int)
    compute: dict[str, int] = defaultdict(int)
    lanes: dict[str, list[str]] = defaultdict(list)
    for pod in bound:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        a = assignment_of(pod)
        assert a.node == node, name
        assert node in inventory, f"{name} went to {node}, not one of the test's nodes"
        by_index = {g.index: g.uuid for g in inventory[node]}
        assert len(a.gpu_uuids) == 1 and a.gpu_uuids == [by_index[i] for i in a.gpu_indices], name
        assert (a.memory_mib, a.compute_percent) == expected[name], name
        uuid = a.gpu_uuids[0]
        memory[uuid] += a.memory_mib
        compute[uuid] += a.compute_percent
        lanes[uuid].append(a.lane_id)
    capacity = {g.uuid: g.memory_mib for gpus in inventory.values() for g in gpus}
    over = {u: (memory[u], compute[u]) for u in memory if memory[u] > capacity[u] or compute[u] > 100}
    assert not over, f"oversubscribed GPUs (MiB, %): {over}"
    assert all(len(ids) == len(set(ids)) for ids in lanes.values()), "two pods share a lane id on a GPU"

    # The extender's own accounting (its /metrics, from its view) agrees with what the API server holds.
    with urllib.request.urlopen(scheduling.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    allocated = {
        (s.labels["node"], int(s.labels["gpu"])): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tessera_gpu_memory_allocated_bytes" and s.labels["node"] in inventory
    }
    held = {(n, g.index): memory[g.uuid] * MIB for n, gpus in inventory.items() for g in gpus}
    assert allocated == held


def test_the_extender_exits_on_sigterm_while_watching(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    """A rollout's SIGTERM stops `tessera extender` at once; it used to wait for the API server to close its
    watches (and be killed at the end of the pod's grace period)."""
    node = nodes.add(f"{namespace}-term", gpus=1)
    port, metrics_port = free_port(), free_port()
    exe = TESSERA
    proc = cluster.spawn(
        f"extender-sigterm-{port}",
        [str(exe), "extender", "--kubeconfig",
         str(chart_rbac["scheduler"].kubeconfig), "--host", "127.0.0.1", "--port", str(port),
         "--metrics-port", str(metrics_port)],
    )  # fmt: skip

    def synced() -> bool:  # the node is in its view: it has listed and goes on to watch
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            return f'node="{node}"' in resp.read().decode()

    wait_until(synced, 60, "the extender's view of the node", proc)
    proc.popen.send_signal(signal.SIGTERM)
    try:
        assert proc.popen.wait(30) == 0, proc.tail()  # the deadline bounds a failure only
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the extender ignored SIGTERM for 30 s:\n{proc.tail()}") from None


def test_kube_schedulers_own_scores_do_not_undo_the_extenders_packing(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    # Two empty 2-GPU nodes, whole-GPU pods that also ask for CPU, one at a time. The extender packs: the
    # second pod goes where the first went (FGD grows no fragmentation either way; the fuller node wins the
    # tie). kube-scheduler's default NodeResourcesFit score (LeastAllocated) and BalancedAllocation favour
    # the emptier node by more than one extender rank is worth, so with them on the pods were spread.
    pair = [nodes.add(f"{namespace}-pack-{i}", gpus=2) for i in range(2)]
    placed: list[str] = []
    for i in range(4):
        pod = fractional_pod(f"whole-{i}", "16384", 100)
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "16", "memory": "64Gi"}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": pair}
                            ]
                        }
                    ]
                }
            }
        }
        create(cluster, namespace, pod)
        got = wait_until(lambda n=f"whole-{i}": bound_pod(cluster, namespace, n), 90, f"whole-{i} bound")
        placed.append(got["spec"]["nodeName"])
    assert placed[0] == placed[1] and placed[2] == placed[3] and placed[0] != placed[2], placed


def _bind(scheduling: Scheduling, namespace: str, pod: dict[str, Any], node: str) -> str:
    """POST /bind as a caller that reaches the extender directly; the Error it answers ("" when bound)."""
    args = {"PodName": "p", "PodNamespace": namespace, "PodUID": pod["metadata"]["uid"], "Node": node}
    request = urllib.request.Request(
        f"{scheduling.extender_url}/bind",
        data=json.dumps(args).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return str(json.loads(resp.read())["Error"])


def test_a_direct_bind_to_a_node_the_pod_does_not_select_is_refused(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    """kube-scheduler filters by nodeSelector before it calls bind; a caller reaching /bind directly is held
    to the same rule by the extender, on the labels the real API server's node watch delivers."""
    picked = nodes.add(f"{namespace}-sel-a", gpus=2, labels={"pool": "a"})
    other = nodes.add(f"{namespace}-sel-b", gpus=2, labels={"pool": "b"})
    pod = fractional_pod("p", "4Gi", 25)
    pod["spec"]["schedulerName"] = "no-such-scheduler"  # nothing else binds it: only the calls below
    pod["spec"]["nodeSelector"] = {"pool": "a"}
    created = create(cluster, namespace, pod)

    def in_view() -> bool:
        with urllib.request.urlopen(scheduling.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        return f'node="{picked}"' in text and f'node="{other}"' in text

    wait_until(in_view, 90, "both nodes in the extender's view", scheduling.extender)
    error = _bind(scheduling, namespace, created, other)
    assert error == (
        f"cannot bind {namespace}/p to {other}: node's labels do not match the pod's nodeSelector pool=a"
    )
    stored = cluster.get(f"/api/v1/namespaces/{namespace}/pods/p")
    assert not stored["spec"].get("nodeName")
    assert contract.ANN_ASSIGNMENT not in (stored["metadata"].get("annotations") or {})

    refusals: list[str] = []

    def bound_to_picked() -> bool:
        # Nodes.add lifts the not-ready taint the API server's admission puts on a new node; until the
        # extender's watch delivers that update, the bind is refused for the taint, and only for it.
        error = _bind(scheduling, namespace, created, picked)
        if error:
            refusals.append(error)
        return not error

    wait_until(bound_to_picked, 60, "the bind to the selected node", scheduling.extender)
    assert all("node.kubernetes.io/not-ready" in r for r in refusals), refusals
    assert cluster.get(f"/api/v1/namespaces/{namespace}/pods/p")["spec"]["nodeName"] == picked
