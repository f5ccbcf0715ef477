"""Generated CRDs: up to date, accepted by Kubernetes' schema, structural, presented as the issue asks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from tessera.api import contract
from tessera.api.crd import all_crds, render_yaml

from .conftest import ROOT

CRDS = all_crds()


def test_crds_directory_matches_generator() -> None:
    on_disk = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    generated = {name: render_yaml(crd) for name, crd in CRDS.items()}
    assert on_disk.keys() == generated.keys(), "run .venv/bin/python hack/gen-crds"
    for name, text in generated.items():
        assert on_disk[name] == text, f"crds/{name} is stale: run .venv/bin/python hack/gen-crds"


def test_gen_crds_script_writes_the_same_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "hack" / "gen-crds"), "--out", str(tmp_path)], check=True)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {n: render_yaml(c) for n, c in CRDS.items()}
    check = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-crds"), "--out", str(tmp_path), "--check"]
    )
    assert check.returncode == 0


def test_generator_is_deterministic() -> None:
    assert {n: render_yaml(c) for n, c in all_crds().items()} == {n: render_yaml(c) for n, c in CRDS.items()}


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crd_validates_with_kubernetes_validate(name: str) -> None:
    crd = yaml.safe_load((ROOT / "crds" / name).read_text())
    kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def _walk(node: dict[str, Any], path: str) -> list[str]:
    """Structural-schema violations (Kubernetes 'structural schema' rules) under one node."""
    problems = []
    for bad in ("$ref", "anyOf", "oneOf", "allOf", "not", "definitions", "$defs"):
        if bad in node:
            problems.append(f"{path}: {bad} is not allowed here")
    if "type" not in node:
        problems.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are exclusive")
    if node.get("exclusiveMinimum") not in (None, True, False):
        problems.append(f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0")
    for key, sub in node.get("properties", {}).items():
        problems += _walk(sub, f"{path}.{key}")
    if "items" in node:
        problems += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += _walk(node["additionalProperties"], f"{path}{{}}")
    return problems


@pytest.mark.parametrize("name", sorted(CRDS))
def test_schema_is_structural(name: str) -> None:
    schema = CRDS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema, "") == []


def test_pod_templates_preserve_unknown_fields_but_require_containers() -> None:
    for crd in CRDS.values():
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        if crd["spec"]["names"]["kind"] == "Queue":
            continue  # a Queue runs no pods
        template = spec["properties"]["template"]
        assert template["x-kubernetes-preserve-unknown-fields"] is True
        assert template["properties"]["spec"]["required"] == ["containers"]
        assert "x-kubernetes-embedded-resource" not in template  # a PodTemplateSpec has no apiVersion/kind


def test_names_columns_and_subresources() -> None:
    by_kind = {c["spec"]["names"]["kind"]: c for c in CRDS.values()}
    assert set(by_kind) == {"App", "TrialGroup", "ModelDeployment", "Queue"}
    columns = {
        k: [col["name"] for col in c["spec"]["versions"][0]["additionalPrinterColumns"]]
        for k, c in by_kind.items()
    }
    assert columns == {
        "App": ["Phase", "Ready", "GPUs", "Rho", "Updated", "Age"],
        "TrialGroup": ["Phase", "Ready", "Running", "Done", "GPUs", "Age"],
        "ModelDeployment": [
            "Phase",
            "Ready",
            "Replicas",
            "Pool",
            "Policy",
            "SLO-ms",
            "Attainment",
            "Goodput",
            "Age",
        ],
        "Queue": ["Guaranteed", "Max", "Allocated", "Borrowed", "Pending", "Age"],
    }
    short = {k: c["spec"]["names"]["shortNames"] for k, c in by_kind.items()}
    assert short == {"App": ["tapp"], "TrialGroup": ["tg"], "ModelDeployment": ["md"], "Queue": ["tq"]}
    for crd in CRDS.values():
        version = crd["spec"]["versions"][0]
        assert crd["spec"]["group"] == contract.GROUP and version["name"] == contract.VERSION
        # Teams' queues span namespaces; the workloads live in one.
        cluster_scoped = crd["spec"]["names"]["kind"] == "Queue"
        assert crd["spec"]["scope"] == ("Cluster" if cluster_scoped else "Namespaced")
        assert crd["spec"]["names"]["categories"] == [contract.CATEGORY]
        assert version["subresources"] == {"status": {}}
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        for col in version["additionalPrinterColumns"]:
            if col["jsonPath"].startswith(".status."):
                # `.status.conditions[?(@.type=="Ready")].status` names the conditions field
                assert col["jsonPath"].removeprefix(".status.").split("[")[0] in status, col


def test_cross_field_rules_are_in_the_crds() -> None:
    text = render_yaml(CRDS["tessera.io_modeldeployments.yaml"])
    assert "supportedBatchSizes must be strictly increasing" in text
    assert "x-kubernetes-validations" in text
    assert "lane.memoryMiB must be <= gpuMemoryMiB" in render_yaml(CRDS["tessera.io_apps.yaml"])
