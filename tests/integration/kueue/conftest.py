"""Fixtures for the Kueue tests: a control plane of their own (kwok's: harness.kwok_control_plane), kwok GPU
nodes, kube-scheduler with its default profile, Kueue itself, and a namespace per test that Kueue manages.

Without Kueue's or kwok's binary and no Go to build them, the tests skip with the reason, as the real-cluster
tests do without the Kubernetes components — except under CI=true, where they fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tessera.api import contract
from tessera.sim.packing.trace import NodeSpec

from tests.integration.k8s.conftest import namespace  # noqa: F401 (a fixture, found by name)
from tests.integration.k8s.controlplane import ControlPlane, NoBinaries, Process, default_scheduler
from tests.integration.kwok.harness import kwok_binary, kwok_control_plane, kwok_nodes, node_body
from tests.requires import missing

from .harness import Kueue, kueue_dir, manage_namespace, running_kueue

# Two fake GPU nodes, 4 `tessera.io/gpu` each: more than any ClusterQueue here may hold, so what holds a Job
# back is Kueue's quota, never the nodes.
NODES = [NodeSpec(f"kueue-gpu-{i}", 32_000, 262_144, 4, "V100M32") for i in range(2)]


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    """This directory's control plane: kwok's (the real-cluster tests' one, with what kwok needs of it)."""
    try:
        kwok_binary()
        kueue_dir()
        plane = kwok_control_plane()
        cp = plane.__enter__()
    except NoBinaries as err:
        missing(f"no Kubernetes control plane, kwok or Kueue: {err}")
    try:
        yield cp
    finally:
        plane.__exit__(None, None, None)


@pytest.fixture(scope="module")
def gpu_nodes(cluster: ControlPlane) -> Iterator[list[str]]:
    """kwok playing NODES (Ready, `tessera.io/gpu` capacity, no reserve taint); deleted after the module."""
    with kwok_nodes(cluster, [node_body(n, reserve=False) for n in NODES]) as names:
        node = cluster.get(f"/api/v1/nodes/{names[0]}")
        assert node["status"]["allocatable"][contract.RESOURCE_GPU] == "4"
        yield names


@pytest.fixture(scope="module")
def scheduler(cluster: ControlPlane) -> Iterator[Process]:
    """kube-scheduler with its default profile: it binds the pods of the Jobs Kueue admits to the kwok nodes."""
    with default_scheduler(cluster) as proc:
        yield proc


@pytest.fixture(scope="module")
def kueue(cluster: ControlPlane) -> Iterator[Kueue]:
    with running_kueue(cluster) as running:
        yield running


@pytest.fixture
def queued(cluster: ControlPlane, namespace: str) -> str:  # noqa: F811 (the imported fixture)
    """A fresh namespace (deleted afterwards) whose queued Jobs and Pods Kueue manages."""
    manage_namespace(cluster, namespace)
    return namespace
