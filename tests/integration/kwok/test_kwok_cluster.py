"""A trace's pods live their lives on kwok nodes under the real scheduler path.

300 of Alibaba's GPU nodes (the agent's GPU annotation, CPU, memory, `tessera.io/gpu` slots, the reserve
taint) played by kwok; the chart's RBAC and gpuNodes routing; the real extender with its allocate handoff on
(kwok marks pods allocated as the agent's Allocate does) behind tessera-scheduler. 100 GPU pods of the
trace's pod list, each with a run time of a few seconds, and one pod with none: every pod is bound by
tessera-scheduler to a kwok node within its capacity, runs, and the timed ones succeed after their run time
while the untimed one keeps running. This keeps the path the trace replays take (issue #41) working.
"""

from __future__ import annotations

import urllib.request
from datetime import datetime
from typing import Any

from kubernetes.utils import parse_quantity
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.sim.packing.trace import read_pods

from tests.integration.k8s.conftest import Credentials, run_scheduling
from tests.integration.k8s.controlplane import ControlPlane, Process, wait_until
from tests.requires import missing

from .harness import (
    NODE_LIST,
    POD_LIST,
    create_nodes,
    create_pods,
    node_body,
    trace_pod,
    trace_specs,
)

NODES, GPU_PODS, SLOTS = 300, 100, 4
LABELS = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}


def _quantity(value: str) -> float:
    return float(parse_quantity(value))  # type: ignore[no-untyped-call]  # the client ships no annotations


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _peak(intervals: list[tuple[float, float, float]]) -> float:
    """The most of a quantity held at once, over (start, end, amount) intervals."""
    events = sorted(
        [(s, a) for s, _, a in intervals] + [(e, -a) for _, e, a in intervals], key=lambda x: (x[0], x[1])
    )
    held = peak = 0.0
    for _, amount in events:
        held += amount
        peak = max(peak, held)
    return peak


def _pods(cluster: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return list((cluster.get(f"/api/v1/namespaces/{namespace}/pods") or {}).get("items") or [])


def _summary(pods: list[dict[str, Any]]) -> str:
    phases: dict[str, int] = {}
    for p in pods:
        key = f"{p['status'].get('phase')}{'/bound' if p['spec'].get('nodeName') else ''}"
        phases[key] = phases.get(key, 0) + 1
    return str(phases)


def test_trace_pods_run_and_succeed_on_kwok_nodes(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    gpu_nodes_policy: list[dict[str, Any]],
    namespace: str,
    kwok: Process,
) -> None:
    if not NODE_LIST.exists() or not POD_LIST.exists():
        missing(f"Alibaba's trace is not at {NODE_LIST.parent}")
    status, out = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": LABELS}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, out
    specs = trace_specs(NODES)
    by_name = {n.name: n for n in specs}
    names = create_nodes(cluster, [node_body(n, reserve=True, slots_per_gpu=SLOTS) for n in specs])
    node = cluster.get(f"/api/v1/nodes/{names[0]}")
    assert node["status"]["allocatable"][contract.RESOURCE_GPU] == str(specs[0].gpus * SLOTS)
    assert node["spec"]["taints"] == [
        {"key": contract.TAINT_GPU_NODE_KEY, "value": contract.TAINT_GPU_NODE_VALUE, "effect": "NoSchedule"}
    ]

    smallest = min(n.gpu_memory_mib for n in specs)
    shapes = [s for s in read_pods(POD_LIST) if s.gpus][:GPU_PODS]
    runs = {f"p{i}": 8.0 + (i % 8) for i in range(len(shapes))}
    bodies = [
        trace_pod(f"p{i}", s, gpu_memory_mib=smallest, duration_s=runs[f"p{i}"], scheduler=None)
        for i, s in enumerate(shapes)
    ]
    bodies.append(trace_pod("forever", shapes[0], gpu_memory_mib=smallest, scheduler=None))

    with run_scheduling(cluster, chart_rbac["scheduler"]) as scheduling:  # the allocate handoff on

        def extender_sees_all() -> bool:
            with urllib.request.urlopen(scheduling.metrics_url, timeout=5) as resp:
                text = resp.read().decode()
            return all(f'node="{n}"' in text for n in names)

        wait_until(extender_sees_all, 60, "the extender's view to hold every kwok node", scheduling.extender)
        created = create_pods(cluster, namespace, bodies)
        assert all(p["spec"]["schedulerName"] == contract.SCHEDULER_NAME for p in created)

        def settled() -> list[dict[str, Any]] | None:
            pods = _pods(cluster, namespace)
            done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
            forever = [p for p in pods if p["metadata"]["name"] == "forever"]
            ok = len(done) == len(shapes) and forever and forever[0]["status"].get("phase") == "Running"
            return pods if ok else None

        pods = wait_until(
            settled,
            150,
            f"{len(shapes)} timed pods to succeed and the untimed one to run "
            f"(now {_summary(_pods(cluster, namespace))})",
            scheduling.extender,
        )

    # Every pod was bound by tessera-scheduler, through the extender (its assignment) to a kwok node, and
    # marked allocated by kwok's stage before it ran.
    for p in pods:
        meta, spec, st = p["metadata"], p["spec"], p["status"]
        assert spec["nodeName"] in by_name, (meta["name"], spec.get("nodeName"))
        assignment = Assignment.parse(meta["annotations"][contract.ANN_ASSIGNMENT])
        assert assignment.node == spec["nodeName"]
        allocated = meta["annotations"][contract.ANN_ALLOCATED].split(",")
        assert allocated == [f"{u}::0" for u in assignment.gpu_uuids]
        assert st.get("podIP") and st.get("hostIP"), st
        if meta["name"] == "forever":
            assert st["containerStatuses"][0]["state"]["running"]
            continue
        term = st["containerStatuses"][0]["state"]["terminated"]
        assert term["reason"] == "Completed" and term["exitCode"] == 0
        lived = _time(term["finishedAt"]) - _time(term["startedAt"])
        assert lived >= runs[meta["name"]] - 0.5, (meta["name"], lived, runs[meta["name"]])

    # Within capacity: at no time did the pods running on a node hold more slots, CPU or memory than it
    # has, nor the pods on one GPU more of its memory than it has.
    now = max(
        _time(
            p["status"]["containerStatuses"][0]["state"].get("terminated", {}).get("finishedAt")
            or "2100-01-01T00:00:00Z"
        )
        for p in pods
    )
    per_node: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    per_gpu: dict[str, list[tuple[float, float, float]]] = {}
    for p in pods:
        state = p["status"]["containerStatuses"][0]["state"]
        if "terminated" in state:
            start, end = _time(state["terminated"]["startedAt"]), _time(state["terminated"]["finishedAt"])
        else:
            start, end = _time(state["running"]["startedAt"]), now + 1
        res = p["spec"]["containers"][0]["resources"]
        held = per_node.setdefault(p["spec"]["nodeName"], {})
        held.setdefault("cpu", []).append((start, end, _quantity(res["requests"]["cpu"])))
        held.setdefault("memory", []).append((start, end, _quantity(res["requests"]["memory"])))
        held.setdefault("slots", []).append((start, end, float(res["limits"][contract.RESOURCE_GPU])))
        assignment = Assignment.parse(p["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
        for uuid in assignment.gpu_uuids:
            per_gpu.setdefault(uuid, []).append((start, end, float(assignment.memory_mib)))
    for name, held in per_node.items():
        n = by_name[name]
        assert _peak(held["cpu"]) <= n.cpu_milli / 1000 + 1e-9, name
        assert _peak(held["memory"]) <= n.memory_mib * 2**20, name
        assert _peak(held["slots"]) <= n.gpus * SLOTS, name
    for uuid, held_gpu in per_gpu.items():
        n = by_name[uuid.removeprefix("GPU-").rsplit("-", 1)[0]]
        assert _peak(held_gpu) <= n.gpu_memory_mib, uuid
