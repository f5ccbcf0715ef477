"""The cluster view's owner index: `pods_with` answers from an index kept on every pod event, and must
agree with a scan of all pods through adds, relabels, updates and deletes."""

from __future__ import annotations

import json
import random
from typing import Any

from tessera.api import contract
from tessera.controller.view import ClusterView, PodInfo


def pod(name: str, ns: str, labels: dict[str, str], phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "status": {"phase": phase}}


def scan(view: ClusterView, label: str, value: str, ns: str) -> dict[str, PodInfo]:
    return {p.name: p for (n, _), p in view.pods.items() if n == ns and p.labels.get(label) == value}


def indexed(view: ClusterView, label: str, value: str, ns: str) -> dict[str, PodInfo]:
    return {p.name: p for p in view.pods_with(label, value, ns)}


def test_index_follows_relabel_update_and_delete() -> None:
    view = ClusterView()
    view.on_pod(pod("p1", "ml", {contract.LABEL_APP: "a", contract.LABEL_JOB: "j1"}))
    view.on_pod(pod("p2", "ml", {contract.LABEL_APP: "a"}))
    view.on_pod(pod("p3", "other", {contract.LABEL_APP: "a"}))
    assert {p.name for p in view.pods_with(contract.LABEL_APP, "a", "ml")} == {"p1", "p2"}
    # An update keeps the pod under its owner with the new body (phase seen by `observe`).
    view.on_pod(pod("p1", "ml", {contract.LABEL_APP: "a", contract.LABEL_JOB: "j1"}, phase="Succeeded"))
    assert {p.phase for p in view.pods_with(contract.LABEL_JOB, "j1", "ml")} == {"Succeeded"}
    # Relabelled to another owner: gone from the old one's pods.
    view.on_pod(pod("p2", "ml", {contract.LABEL_APP: "b"}))
    assert [p.name for p in view.pods_with(contract.LABEL_APP, "a", "ml")] == ["p1"]
    assert [p.name for p in view.pods_with(contract.LABEL_APP, "b", "ml")] == ["p2"]
    view.on_pod(pod("p1", "ml", {contract.LABEL_APP: "a"}), deleted=True)
    assert view.pods_with(contract.LABEL_APP, "a", "ml") == []
    assert view.pods_with(contract.LABEL_JOB, "j1", "ml") == []
    assert [p.name for p in view.pods_with(contract.LABEL_APP, "a", "other")] == ["p3"]


def test_index_agrees_with_a_full_scan_under_random_events() -> None:
    rng = random.Random(7)
    view = ClusterView()
    owners = ["a", "b", "c"]
    for _ in range(2000):
        name, ns = f"p{rng.randrange(30)}", rng.choice(["ml", "dev"])
        labels = {contract.LABEL_APP: rng.choice(owners)}
        if rng.random() < 0.5:
            labels[contract.LABEL_JOB] = rng.choice(["j1", "j2"])
        view.on_pod(pod(name, ns, labels), deleted=rng.random() < 0.3)
    for ns in ("ml", "dev"):
        for owner in owners:
            assert indexed(view, contract.LABEL_APP, owner, ns) == scan(view, contract.LABEL_APP, owner, ns)
        for j in ("j1", "j2"):
            assert indexed(view, contract.LABEL_JOB, j, ns) == scan(view, contract.LABEL_JOB, j, ns)


def test_the_cluster_is_built_once_per_change_of_the_nodes() -> None:
    """cluster() is asked for by every pass of every TrialGroup and ModelDeployment: it is rebuilt only when
    a node's GPUs change, not on a heartbeat that changes none of them, and a change shows at once."""
    view = ClusterView()
    inv = [{"uuid": "GPU-0", "index": 0, "model": "V100", "memoryMiB": 16384, "healthy": True}]
    node = {"metadata": {"name": "n1", "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}}
    assert view.on_node(node)
    first = view.cluster()
    assert view.cluster() is first and first.gpu_ids == ["n1/0"]
    beat = {**node, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert not view.on_node(beat) and view.cluster() is first
    sick = [{**inv[0], "healthy": False}]
    assert view.on_node(
        {"metadata": {"name": "n1", "annotations": {contract.ANN_NODE_GPUS: json.dumps(sick)}}}
    )
    assert view.cluster() is not first and not view.cluster().gpu("n1/0").healthy
    assert view.on_node(node, deleted=True) and len(view.cluster()) == 0
