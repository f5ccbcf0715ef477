"""Pods with equal requests bound to the real node at once, and whether each container got its own pod's lane.

Shared by the node tests (a few rounds) and tests/bench/bench_node_handoff.py (many, handoff on and off). A
pod's container prints the GPU and lane env it was started with; the pod's `tessera.io/assignment` says what
the extender gave it. They must agree for every pod, or the kubelet's Allocate served one pod's lane to another.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract

from tests.integration.k8s.controlplane import wait_until

from .node import Node

SHOW_ENV = (
    "import json, os; print('ENV ' + json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('CUDA_', 'TESSERA_'))}))"
)
FINISHED = ("Succeeded", "Failed")


def lane_pod(node: Node, name: str, memory_mib: int = 1024, compute: int = 10) -> dict[str, Any]:
    """A pod asking for one lane, whose container prints its env and exits."""
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: str(memory_mib),
        contract.RESOURCE_GPU_COMPUTE: str(compute),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"tessera-test": "together"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "show",
                    "image": node.images["TESSERA_IMAGE"],
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", SHOW_ENV],
                    "resources": {"limits": limits},
                }
            ],
        },
    }


@dataclass
class Round:
    pods: int
    seconds_to_bound: float  # creation of the first → the last bound
    seconds_to_done: float  # creation of the first → every pod finished
    mismatches: list[str] = field(default_factory=list)  # pods whose container got another lane
    refused: list[str] = field(
        default_factory=list
    )  # pods the kubelet failed at admission (Allocate refused)

    @property
    def binds_per_second(self) -> float:
        return self.pods / self.seconds_to_bound if self.seconds_to_bound > 0 else float("inf")


def _list(node: Node, namespace: str) -> list[dict[str, Any]]:
    status, body = node.plane.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=tessera-test"
    )
    assert status == 200, body
    return list(body["items"])


def _log(node: Node, namespace: str, name: str) -> str:
    status, body = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
    return body if status == 200 and isinstance(body, str) else ""


def check(node: Node, namespace: str, pod: dict[str, Any]) -> str | None:
    """Why this finished pod's container did not run on its own lane, or None when it did."""
    name = pod["metadata"]["name"]
    assignment = json.loads(pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    line = next((ln for ln in _log(node, namespace, name).splitlines() if ln.startswith("ENV ")), None)
    if line is None:
        return f"{name}: no env in its log"
    env = json.loads(line[4:])
    want = (",".join(assignment["gpuUUIDs"]), assignment["laneId"])
    got = (env.get(contract.ENV_CUDA_VISIBLE_DEVICES), env.get(contract.ENV_LANE_ID))
    return None if got == want else f"{name}: assigned GPU/lane {want}, its container got {got}"


def explain(node: Node, namespace: str) -> str:
    """Where each pod of a round is, and what the extender said last (for a round that did not finish)."""
    lines = []
    for pod in _list(node, namespace):
        st = pod.get("status", {})
        scheduled = next((c for c in st.get("conditions") or [] if c["type"] == "PodScheduled"), {})
        ann = pod["metadata"].get("annotations") or {}
        lines.append(
            f"{pod['metadata']['name']}: {st.get('phase')} node={pod['spec'].get('nodeName')} "
            f"allocated={ann.get(contract.ANN_ALLOCATED)} retry={ann.get(contract.ANN_RETRY)} "
            f"scheduled={scheduled.get('status')} {scheduled.get('reason', '')} {scheduled.get('message', '')[:300]} "
            f"{st.get('reason', '')} {st.get('message', '')[:300]}"
        )
    status, body = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/events")
    for e in (body.get("items") or [])[-20:] if status == 200 else []:
        lines.append(f"event {e['involvedObject']['name']}: {e['reason']}: {e['message'][:300]}")
    status, body = node.plane.request("GET", "/api/v1/namespaces/tessera-system/pods")
    for pod in body.get("items") or [] if status == 200 else []:
        if "scheduler" in pod["metadata"]["name"]:
            path = f"/api/v1/namespaces/tessera-system/pods/{pod['metadata']['name']}/log?container=extender&tailLines=30"
            _, log = node.plane.request("GET", path)
            lines.append(f"extender log:\n{log}")
    return "\n".join(lines)


def bind_together(node: Node, namespace: str, count: int, prefix: str, timeout_s: float = 300) -> Round:
    """Create `count` equal lane pods at once; wait for each to finish; check each one's lane; delete them.

    The node must already publish its `tessera.io/gpu` slots: pods created before the kubelet has them are
    refused by kube-scheduler's own resource fit, and may wait for its periodic retry (5 min)."""

    def slots() -> int:
        status, body = node.plane.request("GET", f"/api/v1/nodes/{node.name}")
        return (
            int((body.get("status") or {}).get("allocatable", {}).get(contract.RESOURCE_GPU, 0))
            if status == 200
            else 0
        )

    wait_until(lambda: slots() >= count, 120, f"the node to publish {count} {contract.RESOURCE_GPU} slots")
    started = time.monotonic()
    for i in range(count):
        status, body = node.plane.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", lane_pod(node, f"{prefix}-{i}")
        )
        assert status == 201, body
    bound_at: float | None = None

    def progress() -> list[dict[str, Any]] | None:
        nonlocal bound_at
        got = _list(node, namespace)
        if bound_at is None and len(got) == count and all(p["spec"].get("nodeName") for p in got):
            bound_at = time.monotonic()
        done = len(got) == count and all(p["status"].get("phase") in FINISHED for p in got)
        return got if done else None

    try:
        finished = wait_until(progress, timeout_s, f"{count} pods bound together to finish")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{explain(node, namespace)}") from err
    done_at = time.monotonic()
    assert bound_at is not None
    result = Round(count, bound_at - started, done_at - started)
    for pod in finished:
        if (
            pod["status"].get("reason") == "UnexpectedAdmissionError"
        ):  # the kubelet failed it: Allocate refused
            result.refused.append(f"{pod['metadata']['name']}: {pod['status'].get('message', '')[:300]}")
            continue
        problem = check(node, namespace, pod)
        if problem is not None:
            result.mismatches.append(problem)
    for pod in finished:
        node.plane.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0"
        )
    wait_until(lambda: not _list(node, namespace), 120, "the round's pods to be gone")
    return result
