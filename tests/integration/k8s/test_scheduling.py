"""The extender under the real kube-scheduler: pods with schedulerName tessera-scheduler are filtered,
scored and bound through the extender, which writes each pod's lane assignment."""

from __future__ import annotations

import json
from typing import Any

from tessera.api import contract

from .conftest import Nodes, Scheduling
from .controlplane import ControlPlane, wait_until


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


def test_a_fractional_pod_is_bound_with_its_lane(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    nodes.add("sched-a", gpus=2, memory_mib=16384)
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", fractional_pod("p", "4Gi", 25)
    )
    assert status == 201, body

    def bound() -> Any:
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/p")
        return pod if pod and pod["spec"].get("nodeName") else None

    pod = wait_until(bound, 90, "the pod to be bound", scheduling.scheduler)
    assert pod["spec"]["nodeName"] == "sched-a"
    assignment = json.loads(pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert assignment["node"] == "sched-a"
