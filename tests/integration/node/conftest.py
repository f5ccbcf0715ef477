"""Fixtures for the node tests: one real one-node cluster per session (node.py), a namespace per test.

Skipped with one line where the machine cannot run a node (not root, no cgroup v1 controllers, a package
missing: `bash hack/install-node-deps.sh`); never under CI=true, where that fails the tests instead.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator

import pytest

from tests.integration.k8s.admin_cli import AdminCLI, find_cli
from tests.integration.k8s.controlplane import NoBinaries, wait_until
from tests.requires import missing

from .node import Node, one_node_cluster


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    try:
        cluster = one_node_cluster()
        made = cluster.__enter__()
    except NoBinaries as err:
        missing(f"no one-node cluster: {err}")
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in made.timings.items())
    print(f"\n[node] up: {timings}", file=sys.stderr)
    try:
        yield made
    finally:
        memory = ", ".join(f"{k} {v:.0f}" for k, v in sorted(made.memory_mib().items()))
        print(f"\n[node] resident memory (MiB): {memory}", file=sys.stderr)
        if made.pod_memory:
            pods = ", ".join(f"{k} {v:.0f}" for k, v in sorted(made.pod_memory.items()))
            print(f"[node] resident memory of the chart's pods (MiB): {pods}", file=sys.stderr)
        timings = ", ".join(f"{k} {v:.1f}s" for k, v in made.timings.items())
        print(f"[node] timings: {timings}", file=sys.stderr)
        cluster.__exit__(None, None, None)


@pytest.fixture
def namespace(node: Node) -> Iterator[str]:
    """A fresh namespace, ready for pods (its `default` ServiceAccount exists); deleted afterwards."""
    name = f"n-{secrets.token_hex(4)}"
    status, body = node.plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    wait_until(
        lambda: node.plane.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount of {name}",
    )
    yield name
    node.plane.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
def admin_cli(node: Node) -> AdminCLI:
    """The Helm 4 CLI and kubectl (hack/cli-assets.sh) as the node cluster's admin, from the repository root."""
    try:
        path = find_cli()
    except NoBinaries as err:
        missing(f"no Helm CLI: {err}")
    return AdminCLI(path, node.plane.kubeconfig, node.plane.workdir / "helm-home")
