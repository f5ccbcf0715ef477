"""Plain pods on the real node: the kubelet runs them through containerd and reports their phase."""

from __future__ import annotations

from typing import Any

from tests.integration.k8s.controlplane import wait_until

from .node import Node


def pod_phase(node: Node, namespace: str, name: str) -> str | None:
    got = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return got["status"].get("phase") if isinstance(got, dict) else None


def create_pod(node: Node, namespace: str, body: dict[str, Any]) -> None:
    status, got = node.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    assert status == 201, got


def test_node_registered_by_its_kubelet(node: Node) -> None:
    got = node.node()
    assert got is not None
    info = got["status"]["nodeInfo"]
    assert info["kubeletVersion"].startswith("v1.")
    assert info["containerRuntimeVersion"].startswith("containerd://")
    addresses = {a["type"]: a["address"] for a in got["status"]["addresses"]}
    assert addresses["InternalIP"] == node.address
    # The kubelet's own identity: the Node authorizer let system:node:<name> create and update it.
    assert got["metadata"]["labels"]["kubernetes.io/hostname"] == node.name


def test_plain_pod_runs_to_succeeded(node: Node, namespace: str) -> None:
    create_pod(
        node,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hello"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "hello",
                        "image": node.images["TESSERA_IMAGE"],
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", "import sys; print('hello from', sys.version)"],
                    }
                ],
            },
        },
    )
    wait_until(lambda: pod_phase(node, namespace, "hello") == "Succeeded", 180, "the pod to succeed")
    status, log = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/hello/log")
    assert status == 200, log
    assert "hello from 3.11" in log
