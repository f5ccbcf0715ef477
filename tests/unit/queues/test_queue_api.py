"""Queue manifests: single-object rules with field paths, and the rules over several Queues."""

from __future__ import annotations

from typing import Any

from tessera.api import manifest_errors, parse_queue
from tessera.api.crd import openapi_schema
from tessera.api.queue import QueueSpec, hierarchy_errors
from tessera.api.resources import KINDS

from tests.unit.api.apiserver import cel_errors, openapi_errors


def queue(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "tessera.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}, "spec": spec}


def test_defaults() -> None:
    q = parse_queue(queue())
    assert (q.spec.guaranteed_gpus, q.spec.max_gpus, q.spec.weight, q.spec.reclaim.mode) == (
        0,
        None,
        1,
        "atLeaseEnd",
    )


def test_field_paths() -> None:
    assert manifest_errors(queue(guaranteedGPUs=4, maxGPUs=2)) == [
        ("spec.maxGPUs", "maxGPUs must be >= guaranteedGPUs")
    ]
    assert manifest_errors(queue(weight=0)) == [("spec.weight", "must be > 0")]
    assert manifest_errors(queue(reclaim={"mode": "never"})) == [
        ("spec.reclaim.mode", "must be one of 'atLeaseEnd' or 'immediate'")
    ]
    assert manifest_errors(queue(guaranteedGPUs=0.5)) == []  # lanes count


def test_lending_limit_within_the_guarantee() -> None:
    assert parse_queue(queue()).spec.lending_limit_gpus is None  # unset: lends all its unused guarantee
    assert manifest_errors(queue(guaranteedGPUs=4, lendingLimitGPUs=4)) == []
    assert manifest_errors(queue(guaranteedGPUs=4, lendingLimitGPUs=1.5)) == []
    assert manifest_errors(queue(guaranteedGPUs=4, lendingLimitGPUs=4.5)) == [
        ("spec.lendingLimitGPUs", "lendingLimitGPUs must be <= guaranteedGPUs")
    ]
    assert manifest_errors(queue(lendingLimitGPUs=1)) == [
        ("spec.lendingLimitGPUs", "lendingLimitGPUs must be <= guaranteedGPUs")
    ]
    assert manifest_errors(queue(guaranteedGPUs=4, lendingLimitGPUs=-1)) == [
        ("spec.lendingLimitGPUs", "must be >= 0")
    ]


def test_the_crd_refuses_a_lending_limit_above_the_guarantee_with_the_models_message() -> None:
    schema = openapi_schema(KINDS["Queue"])
    for ok in (queue(guaranteedGPUs=4, lendingLimitGPUs=4), queue(guaranteedGPUs=2.5, lendingLimitGPUs=0)):
        assert openapi_errors(ok, schema) == [] and cel_errors(ok, schema) == []
    bad = queue(guaranteedGPUs=4, lendingLimitGPUs=4.5)
    assert cel_errors(bad, schema) == [
        ("spec.lendingLimitGPUs", "lendingLimitGPUs must be <= guaranteedGPUs")
    ]
    assert cel_errors(queue(lendingLimitGPUs=1), schema) == cel_errors(bad, schema)  # guaranteedGPUs: 0
    assert {p for p, _ in openapi_errors(queue(lendingLimitGPUs=-1), schema)} == {"spec.lendingLimitGPUs"}


def spec(**kw: Any) -> QueueSpec:
    return QueueSpec.model_validate(kw)


def test_children_guaranteed_more_than_the_parent() -> None:
    specs = {
        "org": spec(guaranteedGPUs=8),
        "a": spec(guaranteedGPUs=6, parent="org"),
        "b": spec(guaranteedGPUs=4, parent="org"),
    }
    assert hierarchy_errors(specs) == {
        "org": [("spec.guaranteedGPUs", "children a, b are guaranteed 10 GPUs in all, above this queue's 8")]
    }


def test_unknown_parent_and_cycle() -> None:
    errors = hierarchy_errors({"a": spec(parent="b"), "b": spec(parent="a"), "c": spec(parent="zzz")})
    assert errors["c"] == [("spec.parent", "queue 'zzz' does not exist")]
    assert errors["a"] == [("spec.parent", "parents form a cycle through 'a'")]


def test_a_valid_two_level_tree_has_no_errors() -> None:
    specs = {
        "org": spec(guaranteedGPUs=8),
        "a": spec(guaranteedGPUs=6, parent="org"),
        "b": spec(parent="org"),
    }
    assert hierarchy_errors(specs) == {}
