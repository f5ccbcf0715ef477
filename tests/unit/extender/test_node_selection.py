"""node_selection: nodeName, nodeSelector, required node affinity and taints, rule by rule."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.extender.node_selection import (
    NodeFacts,
    Taint,
    matches_node_selector,
    tolerates,
    untolerated_taint,
    why_not_selected,
)

NODE = NodeFacts("gpu-a", {"zone": "a", "gpu": "a100", "rank": "5"})


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": spec}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


def test_a_pod_without_constraints_selects_any_node() -> None:
    assert why_not_selected(pod(), NODE) is None
    assert why_not_selected({}, NodeFacts("bare")) is None


def test_node_name_must_be_this_node_when_set() -> None:
    assert why_not_selected(pod(nodeName="gpu-a"), NODE) is None
    assert why_not_selected(pod(nodeName="gpu-b"), NODE) == "pod's spec.nodeName is gpu-b"
    assert why_not_selected(pod(nodeName=""), NODE) is None


def test_node_selector_needs_every_label_with_its_value() -> None:
    assert why_not_selected(pod(nodeSelector={"zone": "a", "gpu": "a100"}), NODE) is None
    why = why_not_selected(pod(nodeSelector={"zone": "a", "gpu": "h100"}), NODE)
    assert why is not None and "gpu=h100" in why
    assert why_not_selected(pod(nodeSelector={"missing": ""}), NODE) is not None
    assert why_not_selected(pod(nodeSelector={}), NODE) is None


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "b"), False),
        (expr("absent", "In", "a"), False),
        (expr("zone", "NotIn", "b"), True),
        (expr("zone", "NotIn", "a"), False),
        (expr("absent", "NotIn", "a"), True),  # NotIn holds for a node without the label
        (expr("zone", "Exists"), True),
        (expr("absent", "Exists"), False),
        (expr("absent", "DoesNotExist"), True),
        (expr("zone", "DoesNotExist"), False),
        (expr("rank", "Gt", "4"), True),
        (expr("rank", "Gt", "5"), False),
        (expr("rank", "Lt", "6"), True),
        (expr("rank", "Lt", "5"), False),
        (expr("rank", "Gt", "-3"), True),
        (expr("rank", "Gt", "+4"), True),
        (expr("zone", "Gt", "1"), False),  # the label is not an integer
        (expr("absent", "Lt", "9"), False),  # nor present
        (expr("rank", "Gt", "4.5"), False),  # the value must be an integer
        (expr("rank", "Gt", "9223372036854775808"), False),  # past int64
        (expr("rank", "Gt", "1", "2"), False),  # Gt takes exactly one value
        (expr("zone", "In"), False),  # In with no values is malformed
        (expr("zone", "Exists", "a"), False),  # Exists with values is malformed
        (expr("zone", "Like", "a"), False),  # unknown operator
    ],
)
def test_match_expression_operators(term: dict[str, Any], matches: bool) -> None:
    assert matches_node_selector({"nodeSelectorTerms": [term]}, NODE) is matches
    assert (why_not_selected(pod(affinity=affinity(term)), NODE) is None) is matches


@pytest.mark.parametrize(
    ("field", "matches"),
    [
        ({"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}, True),
        ({"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}, False),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["gpu-b"]}, True),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["gpu-a"]}, False),
        ({"key": "metadata.name", "operator": "In", "values": ["gpu-a", "gpu-b"]}, False),  # one value only
        ({"key": "metadata.name", "operator": "Exists"}, False),  # fields take In and NotIn only
        ({"key": "spec.unschedulable", "operator": "In", "values": ["false"]}, False),  # unknown field
    ],
)
def test_match_fields_name_the_node(field: dict[str, Any], matches: bool) -> None:
    assert matches_node_selector({"nodeSelectorTerms": [{"matchFields": [field]}]}, NODE) is matches


def test_terms_are_ored_and_requirements_within_a_term_anded() -> None:
    zone_b, gpu_a100 = expr("zone", "In", "b"), expr("gpu", "In", "a100")
    assert why_not_selected(pod(affinity=affinity(zone_b, gpu_a100)), NODE) is None
    assert why_not_selected(pod(affinity=affinity(zone_b)), NODE) is not None
    both = {
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}],
    }
    assert not matches_node_selector({"nodeSelectorTerms": [both]}, NODE)  # the field fails: the term fails
    both["matchFields"] = [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]
    assert matches_node_selector({"nodeSelectorTerms": [both]}, NODE)
    # a malformed term fails alone; another term may still match
    assert matches_node_selector({"nodeSelectorTerms": [expr("zone", "In"), gpu_a100]}, NODE)


def test_empty_terms_match_no_node() -> None:
    why = why_not_selected(pod(affinity=affinity()), NODE)
    assert why == "node does not match the pod's required node affinity"
    assert not matches_node_selector({"nodeSelectorTerms": [{}]}, NODE)
    assert not matches_node_selector({"nodeSelectorTerms": [{"matchExpressions": []}]}, NODE)
    # no required affinity at all (only preferred) constrains nothing
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert why_not_selected(pod(affinity=preferred), NODE) is None


def test_node_selector_and_affinity_must_both_hold() -> None:
    p = pod(nodeSelector={"zone": "a"}, affinity=affinity(expr("gpu", "In", "h100")))
    assert why_not_selected(p, NODE) is not None


GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "value": "present"}, True),  # operator defaults to Equal; any effect
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "other"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Lt", "value": "present"}, False),
    ],
)
def test_toleration_rules(toleration: dict[str, Any], tolerated: bool) -> None:
    assert tolerates(toleration, GPU_TAINT) is tolerated


def test_untolerated_hard_taints_refuse_the_node() -> None:
    tainted = NodeFacts(
        "gpu-a",
        {},
        (GPU_TAINT, Taint("soft", "", "PreferNoSchedule"), Taint("drain", "now", "NoExecute")),
    )
    gpu_ok = {"key": "nvidia.com/gpu", "operator": "Exists"}
    why = why_not_selected(pod(tolerations=[gpu_ok]), tainted)
    assert why == "node has taint drain=now:NoExecute that the pod does not tolerate"
    drain_ok = {"key": "drain", "operator": "Equal", "value": "now", "effect": "NoExecute"}
    assert why_not_selected(pod(tolerations=[gpu_ok, drain_ok]), tainted) is None  # PreferNoSchedule: ignored
    assert why_not_selected(pod(tolerations=[{"operator": "Exists"}]), tainted) is None
    assert untolerated_taint([], tainted.taints) == GPU_TAINT


def test_node_facts_read_labels_and_taints_from_a_node_object() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}, {"key": "e"}]},
    }
    facts = NodeFacts.of(node)
    assert facts == NodeFacts("n1", {"zone": "a"}, (Taint("k", "v", "NoSchedule"), Taint("e", "", "")))
    assert NodeFacts.of({"metadata": {"name": "n2"}}) == NodeFacts("n2")


def test_malformed_pod_fields_never_raise() -> None:
    for spec in (
        {"nodeSelector": ["zone"], "tolerations": "all"},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
        {"affinity": affinity({"matchExpressions": [{"key": 1, "operator": "In", "values": [2]}]})},
        {"affinity": affinity({"matchExpressions": "zone"}, {"matchFields": [None]})},
    ):
        why_not_selected({"spec": spec}, NODE)  # an answer, never an exception
    # a required affinity that is not an object has no terms: it matches no node
    bad = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}}
    assert why_not_selected({"spec": bad}, NODE) is not None
