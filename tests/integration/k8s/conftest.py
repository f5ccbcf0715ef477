"""Fixtures for the real-cluster tests: one control plane per session, a namespace per test, GPU nodes.

The control plane is real (see controlplane.py); only the kubelet is missing, so tests create Node objects
the way the node agent would publish them and play the kubelet's part on pods (status patches). Without
the binaries the tests skip with the reason — except under CI=true, where a missing binary fails them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus

from .controlplane import ROOT, ControlPlane, NoBinaries, control_plane, wait_until


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    try:
        plane = control_plane()
        cp = plane.__enter__()
    except NoBinaries as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real-cluster tests cannot run in CI: {err}")
        pytest.skip(f"no Kubernetes control plane: {err}")
    try:
        yield cp
    finally:
        plane.__exit__(None, None, None)


@pytest.fixture(scope="session")
def crds(cluster: ControlPlane) -> ControlPlane:
    """The chart's CRDs applied the way the README tells users to (server-side apply), and Established."""
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "charts" / "tessera" / "crds"))
    for plural in (contract.PLURAL_APP, contract.PLURAL_TRIALGROUP, contract.PLURAL_MODELDEPLOYMENT):
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.{contract.GROUP}"
        )
    return cluster


@pytest.fixture
def namespace(cluster: ControlPlane) -> Iterator[str]:
    """A fresh namespace, ready for pods (its `default` ServiceAccount exists); deleted afterwards."""
    name = f"t-{secrets.token_hex(4)}"
    status, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    wait_until(
        lambda: cluster.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount of {name}",
    )
    yield name
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")


def gpu_node_body(
    name: str, gpus: int, memory_mib: int = 16384, model: str = "V100", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    inv = [GpuInfo(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=memory_mib) for i in range(gpus)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)},
        },
    }


def node_status(gpus: int, slots_per_gpu: int = 1) -> dict[str, Any]:
    """What a kubelet with the node agent reports: Ready, CPU/memory/pods, and the agent's GPU slots."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "250", contract.RESOURCE_GPU: str(gpus * slots_per_gpu)}
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "played by the test",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    }


class Nodes:
    """Creates Ready GPU nodes and deletes them when the test ends (nodes are cluster-wide)."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.names: list[str] = []

    def add(self, name: str, gpus: int, *, slots_per_gpu: int = 1, **kw: Any) -> str:
        status, body = self.cluster.request("POST", "/api/v1/nodes", gpu_node_body(name, gpus, **kw))
        assert status == 201, body
        self.names.append(name)
        status, body = self.cluster.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            node_status(gpus, slots_per_gpu),
            content_type="application/merge-patch+json",
        )
        assert status == 200, body
        return name

    def cleanup(self) -> None:
        for name in self.names:
            with contextlib.suppress(Exception):
                self.cluster.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture
def nodes(cluster: ControlPlane) -> Iterator[Nodes]:
    made = Nodes(cluster)
    yield made
    made.cleanup()


def set_pod_phase(cluster: ControlPlane, namespace: str, name: str, phase: str) -> None:
    """Play the kubelet: move a pod's phase through the status subresource."""
    status, body = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"phase": phase}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, json.dumps(body)[:500]
