"""The handoff under the real kube-scheduler and API server: a node is handed one GPU pod at a time (issue 44).

These nodes have no kubelet, so the test plays the node agent's one act the handoff depends on: once a pod is
bound, it writes `tessera.io/allocated` on it, as the agent does when Allocate has served it. Until then no
other GPU pod may be bound to that node; pods for other nodes are not held up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from tessera.api import contract

from .conftest import Credentials, Nodes, Scheduling, run_scheduling
from .controlplane import ControlPlane, wait_until
from .test_scheduling import create, fractional_pod


@pytest.fixture(scope="module")
def handing_off(cluster: ControlPlane, chart_rbac: dict[str, Credentials]) -> Iterator[Scheduling]:
    """The extender as the chart runs it (handoff on, its defaults) beside tessera-scheduler."""
    with run_scheduling(cluster, chart_rbac["scheduler"]) as started:
        yield started


def pinned(name: str, node: str) -> dict[str, Any]:
    pod = fractional_pod(name, "2048", 10)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def bound_names(cluster: ControlPlane, namespace: str, node: str) -> list[str]:
    items = cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return sorted(p["metadata"]["name"] for p in items if p["spec"].get("nodeName") == node)


def mark_allocated(cluster: ControlPlane, namespace: str, name: str) -> None:
    status, body = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        {"metadata": {"annotations": {contract.ANN_ALLOCATED: f"GPU-{name}::0"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body


def test_a_node_is_handed_one_gpu_pod_at_a_time_and_the_next_is_bound_once_the_agent_marks_the_last(
    cluster: ControlPlane, handing_off: Scheduling, nodes: Nodes, namespace: str
) -> None:
    node = nodes.add(f"{namespace}-ho", gpus=2, slots_per_gpu=8)
    other = nodes.add(f"{namespace}-ho2", gpus=1, slots_per_gpu=8)
    for i in range(4):
        create(cluster, namespace, pinned(f"p{i}", node))
    create(cluster, namespace, pinned("elsewhere", other))
    first = wait_until(
        lambda: bound_names(cluster, namespace, node), 120, "a first pod bound", handing_off.extender
    )
    assert len(first) == 1
    # the pod for the other node is bound meanwhile: only its own node waits
    wait_until(
        lambda: bound_names(cluster, namespace, other),
        120,
        "the other node's pod bound",
        handing_off.extender,
    )
    handed: list[str] = []
    started = time.monotonic()
    for _ in range(4):
        now = bound_names(cluster, namespace, node)
        (new,) = [n for n in now if n not in handed]  # never two waiting at once
        handed.append(new)
        time.sleep(1.0)  # a window in which a second bind would show up if the handoff let it through
        assert bound_names(cluster, namespace, node) == sorted(handed), (
            "a second pod was bound while one waited"
        )
        mark_allocated(cluster, namespace, new)
        if len(handed) < 4:
            wait_until(
                lambda: len(bound_names(cluster, namespace, node)) > len(handed),
                120,
                "the next pod bound once the last was marked allocated",
                handing_off.extender,
            )
    elapsed = time.monotonic() - started
    assert sorted(handed) == [f"p{i}" for i in range(4)]
    print(
        f"\nhandoff on the real control plane: 4 pods handed to one node in {elapsed:.1f} s (1 s hold each)"
    )
