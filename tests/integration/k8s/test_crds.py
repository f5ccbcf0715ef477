"""The CRDs on a real API server: accepted by server-side apply (CEL cost budget, structural schema), every
valid example accepted, every invalid example rejected at the field paths `tessera validate` names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tessera.api import contract
from tessera.api.resources import KINDS

from tests.unit.api.conftest import INVALID, VALID, documents, expected_errors, load

from .controlplane import ControlPlane


def test_every_crd_is_established(crds: ControlPlane) -> None:
    out = crds.kubectl("get", "crd", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert {f"{k.plural}.{contract.GROUP}" for k in KINDS.values()} <= set(out)
    # `kubectl explain` works only once the server published the schema: a user's first look at a kind.
    explained = crds.kubectl("explain", "modeldeployments.spec.latencyProfiles.points").stdout
    assert "batchSize" in explained


def _dry_run(cluster: ControlPlane, namespace: str, path: Path) -> tuple[int, str]:
    """`kubectl apply --dry-run=server` of an example's Tessera objects, moved into the test's namespace
    (text otherwise as is; test_examples.py applies the files as they are)."""
    docs = documents(path)
    for doc in docs:
        if KINDS[doc["kind"]].scope == "Namespaced":  # a Queue is cluster-scoped
            doc["metadata"]["namespace"] = namespace
    text = yaml.safe_dump_all(docs)
    res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=text, check=False)
    return res.returncode, res.stderr


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_is_accepted(crds: ControlPlane, namespace: str, path: Path) -> None:
    code, stderr = _dry_run(crds, namespace, path)
    assert code == 0, stderr


def _server_paths(stderr: str) -> set[str]:
    """Field paths in the API server's Invalid error: `* spec.x: Invalid value …` / `unknown field "spec.y"`."""
    paths = set(re.findall(r"^\* (spec[^\s:]*)", stderr, re.MULTILINE))
    paths |= set(re.findall(r'unknown field "(spec[^"]*)"', stderr))
    paths |= set(re.findall(r"The \w+ \"[^\"]+\" is invalid: (spec[^\s:]*)", stderr))
    return paths


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_is_rejected_at_the_validate_path(
    crds: ControlPlane, namespace: str, path: Path
) -> None:
    # Strict field validation is what `kubectl apply` uses by default, so a misspelt field is an error.
    code, stderr = _dry_run(crds, namespace, path)
    assert code != 0, f"{path.name} was accepted by the API server"
    expected = {p for p, _ in expected_errors(path)}
    got = _server_paths(stderr)
    if "strict decoding error" in stderr:
        # An unknown field fails decoding (400) before the schema is checked, so the server names only
        # that field; `tessera validate` also reports what the schema would say next.
        assert got and got <= expected, stderr
    else:
        assert got == expected, stderr


def test_server_side_apply_twice_is_a_no_op(crds: ControlPlane, namespace: str) -> None:
    doc = load(VALID[0])
    doc["metadata"]["namespace"] = namespace
    text = yaml.safe_dump(doc)
    first = crds.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", stdin=text)
    second = crds.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", stdin=text)
    assert "serverside-applied" in first.stdout and "serverside-applied" in second.stdout
    crds.kubectl("delete", "-n", namespace, "-f", "-", stdin=text)
