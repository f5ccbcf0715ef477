"""Plain pods on the real node: the kubelet runs them through containerd and reports their phase."""

from __future__ import annotations

import socket
from typing import Any

import pytest

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


def test_a_cluster_ip_kube_proxy_has_not_programmed_is_refused_on_the_node(node: Node) -> None:
    # Untranslated traffic to the Service range must not leave the host: this machine's upstream gateway
    # accepts any TCP connection and answers HTTP, and a client that got there before kube-proxy's sync kept
    # its connection to it (the ModelDeployment test's 300 s wait for a model its gateway served).
    used = {s["spec"].get("clusterIP") for s in (node.plane.get("/api/v1/services") or {}).get("items") or []}
    free = next(ip for i in range(254, 1, -1) if (ip := f"10.0.0.{i}") not in used)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((free, 80), timeout=30).close()
