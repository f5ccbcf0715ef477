"""The examples applied with kubectl exactly as the README and the chart's NOTES tell a new admin, on a
cluster that has nothing but the CRDs the chart installs: every object of every file is created (the
Namespaces come with the examples), and a directory apply leaves `examples/invalid/` alone."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tessera.api import contract
from tessera.api.resources import KINDS

from tests.unit.chart.chart_render import render

from .admin_cli import AdminCLI
from .conftest import delete_namespace
from .controlplane import ROOT, ControlPlane, wait_until

EXAMPLES = ROOT / "examples"


def docs_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def api_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    if obj["kind"] == "Namespace":
        return f"/api/v1/namespaces/{meta['name']}"
    kind = KINDS[obj["kind"]]
    scope = f"/namespaces/{meta['namespace']}" if kind.scope == "Namespaced" else ""
    return f"/apis/{contract.GROUP}/{contract.VERSION}{scope}/{kind.plural}/{meta['name']}"


def commands(text: str) -> list[str]:
    """The `kubectl apply -f examples...` lines of a document, as written (comments dropped)."""
    return re.findall(r"^\s*kubectl apply -f (examples/\S*)", text, re.MULTILINE)


def namespaces_of(paths: list[Path]) -> set[str]:
    return {d["metadata"]["name"] for p in paths for d in docs_of(p) if d["kind"] == "Namespace"}


def remove(cluster: ControlPlane, paths: list[Path]) -> None:
    """Delete what the examples created and wait until their namespaces are gone (a fresh cluster again)."""
    for p in paths:
        for d in docs_of(p):
            if d["kind"] == "Queue":
                cluster.request("DELETE", api_path(d))
    names = namespaces_of(paths)
    for name in names:
        delete_namespace(cluster, name)
    for name in names:
        wait_until(
            lambda n=name: cluster.request("GET", f"/api/v1/namespaces/{n}")[0] == 404,
            180,
            f"namespace {name} to be deleted",
        )


@pytest.fixture
def fresh(crds: ControlPlane) -> Iterator[ControlPlane]:
    files = sorted(EXAMPLES.glob("*.yaml"))
    for name in namespaces_of(files):
        assert crds.request("GET", f"/api/v1/namespaces/{name}")[0] == 404, f"{name} exists before the test"
    yield crds
    remove(crds, files)


def assert_created(cluster: ControlPlane, paths: list[Path], out: str) -> None:
    for p in paths:
        for d in docs_of(p):
            live = cluster.get(api_path(d))
            assert live is not None, f"{d['kind']}/{d['metadata']['name']} of {p.name} was not created\n{out}"
            want = d["metadata"].get("labels") or {}
            assert want.items() <= (live["metadata"].get("labels") or {}).items(), d["metadata"]["name"]


def test_the_notes_apply_every_example_on_a_fresh_cluster(fresh: ControlPlane, admin_cli: AdminCLI) -> None:
    notes = render()["tessera/templates/NOTES.txt"]
    assert commands(notes) == ["examples/"]
    files = sorted(EXAMPLES.glob("*.yaml"))
    res = admin_cli.kubectl("apply", "-f", "examples/")
    assert_created(fresh, files, res.stdout)
    listed = admin_cli.kubectl("get", "apps,trialgroups,modeldeployments", "-A").stdout  # NOTES' next line
    assert "apps,trialgroups,modeldeployments -A" in notes
    for name in ("resnet50-lr-search", "cifar10-hyperband-r0", "bart-summarizer", "resnet50-prod"):
        assert name in listed, listed
    # Each object once (a Namespace two files declare: created, then unchanged); nothing failed.
    lines = res.stdout.splitlines()
    assert len(lines) == sum(len(docs_of(p)) for p in files) and not res.stderr, res
    assert "namespace/research created" in lines and "namespace/research unchanged" in lines
    # The namespaces carry the labels the docs name: the Queue of research, gpuNodes.reserve's routing.
    research = fresh.get("/api/v1/namespaces/research")["metadata"]["labels"]
    serving = fresh.get("/api/v1/namespaces/serving")["metadata"]["labels"]
    assert (
        research[contract.LABEL_QUEUE] == "team-a" and research[contract.LABEL_GPU_NODES_NAMESPACE] == "true"
    )
    assert serving[contract.LABEL_GPU_NODES_NAMESPACE] == "true"
    # The directory apply is not recursive: the broken examples in examples/invalid/ were not sent.
    for p in sorted((EXAMPLES / "invalid").glob("*.yaml")):
        for d in docs_of(p):
            if KINDS[d["kind"]].scope == "Namespaced":
                d["metadata"].setdefault("namespace", "default")
            assert fresh.request("GET", api_path(d))[0] == 404, p.name


def test_the_readme_lines_work_one_by_one_on_a_fresh_cluster(
    fresh: ControlPlane, admin_cli: AdminCLI
) -> None:
    lines = commands((ROOT / "README.md").read_text())
    assert lines == ["examples/app.yaml", "examples/trialgroup.yaml", "examples/modeldeployment.yaml"]
    for line in lines:  # app.yaml runs first, on a cluster without its namespace
        res = admin_cli.kubectl("apply", "-f", line)
        assert_created(fresh, [ROOT / line], res.stdout)
    listed = admin_cli.kubectl("get", "tessera", "-A").stdout
    for name in ("resnet50-lr-search", "cifar10-hyperband-r0", "bart-summarizer"):
        assert name in listed, listed
