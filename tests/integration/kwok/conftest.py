"""Fixtures for the kwok tests: a control plane of their own (harness.kwok_control_plane), the chart's CRDs,
RBAC and gpuNodes routing and a namespace per test as in tests/integration/k8s, and kwok itself.

Without kwok's binary and no Go to build it, the tests skip with the reason, as the real-cluster tests do
without the Kubernetes components — except under CI=true, where they fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.k8s.conftest import (  # noqa: F401 (fixtures, found by name)
    chart_rbac,
    crds,
    gpu_nodes_policy,
    namespace,
)
from tests.integration.k8s.controlplane import ControlPlane, NoBinaries, Process
from tests.requires import missing

from .harness import delete_kwok_nodes, kwok_binary, kwok_control_plane, start_kwok


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    """This directory's control plane: the real-cluster tests' one, with what kwok needs of it."""
    try:
        kwok_binary()
        plane = kwok_control_plane()
        cp = plane.__enter__()
    except NoBinaries as err:
        missing(f"no Kubernetes control plane or kwok: {err}")
    try:
        yield cp
    finally:
        plane.__exit__(None, None, None)


@pytest.fixture(scope="module")
def kwok(cluster: ControlPlane) -> Iterator[Process]:
    """kwok playing tests/integration/kwok/stages.yaml; the kwok nodes are deleted and kwok stopped after."""
    proc = start_kwok(cluster)
    try:
        yield proc
    finally:
        delete_kwok_nodes(cluster)
        proc.stop()
