"""Each example validates (or fails) the same way under the models, the OpenAPI schema and the CEL rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from tessera.api.crd import openapi_schema
from tessera.api.resources import KINDS, manifest_errors

from .apiserver import cel_errors, openapi_errors
from .conftest import INVALID, VALID, documents, expected_errors, load


def test_there_is_a_valid_and_an_invalid_example_per_kind() -> None:
    assert {d["kind"] for p in VALID for d in documents(p)} == set(KINDS)
    assert {load(p)["kind"] for p in INVALID} == set(KINDS)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_passes_models_schema_and_cel(path: Path) -> None:
    for doc in documents(path):
        schema = openapi_schema(KINDS[doc["kind"]])
        assert manifest_errors(doc) == []
        assert openapi_errors(doc, schema) == []
        assert cel_errors(doc, schema) == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_gives_its_documented_error(path: Path) -> None:
    expected = expected_errors(path)
    assert expected, f"{path.name} must document its error in '# expect:' lines"
    assert set(manifest_errors(load(path))) == expected


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_api_server_rejects_invalid_example_at_the_same_path(path: Path) -> None:
    doc = load(path)
    schema = openapi_schema(KINDS[doc["kind"]])
    server_paths = {p for p, _ in openapi_errors(doc, schema)} | {p for p, _ in cel_errors(doc, schema)}
    assert server_paths == {p for p, _ in expected_errors(path)}


def test_cel_rule_messages_are_the_models_messages() -> None:
    for path in INVALID:
        doc = load(path)
        cel = set(cel_errors(doc, openapi_schema(KINDS[doc["kind"]])))
        assert cel <= expected_errors(path)
