"""Does a pod select a node: spec.nodeName, nodeSelector, required node affinity and NoSchedule/NoExecute
taints against the pod's tolerations, as kube-scheduler's NodeName, NodeAffinity and TaintToleration
filter plugins decide them.

kube-scheduler checks these before it asks the extender to bind, so filter does not repeat them; bind does
(Extender._bind_locked), because a caller that reaches /bind directly would otherwise bind a pod to a node
where its GPUs fit but that the pod does not select.

Semantics (Kubernetes core/v1 NodeSelector, labels.Requirement, Toleration.ToleratesTaint):
- nodeSelector: every key present on the node with exactly that value.
- requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: ORed; an empty list matches no node, and
  so does an empty term. Within a term every matchExpressions (node labels) and matchFields (node fields:
  only `metadata.name`, operators In/NotIn with one value) entry must hold. In: label present with a listed
  value; NotIn: label absent or not listed; Exists / DoesNotExist: key present / absent (no values); Gt / Lt:
  label present, it and the single value both base-10 int64, label > (<) value. A malformed requirement
  (In with no values, Exists with values, a non-integer Gt, an unknown operator or field) makes its term
  match nothing, as the scheduler skips terms it cannot parse.
- a taint of effect NoSchedule or NoExecute must be tolerated by some toleration: the toleration's effect
  empty or equal, its key empty or equal, and operator Exists (any value) or Equal/empty (equal values);
  so an empty key with Exists tolerates every taint. PreferNoSchedule taints never refuse a node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JsonObj = dict[str, Any]

HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
NODE_NAME_FIELD = "metadata.name"
_INT = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt(s, 10, 64) takes (range checked apart)
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What selection reads from a Node: its name, labels and taints."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    @classmethod
    def of(cls, node: JsonObj) -> NodeFacts:
        meta = _obj(node.get("metadata"))
        labels = {str(k): str(v) for k, v in _obj(meta.get("labels")).items()}
        taints = tuple(
            Taint(_str(t.get("key")), _str(t.get("value")), _str(t.get("effect")))
            for t in _list(_obj(node.get("spec")).get("taints"))
            if isinstance(t, dict)
        )
        return cls(_str(meta.get("name")), labels, taints)


def why_not_selected(pod: JsonObj, node: NodeFacts) -> str | None:
    """None when the pod may go to `node`, else why not (for the bind's Error)."""
    spec = _obj(pod.get("spec"))
    bound = spec.get("nodeName")
    if bound and bound != node.name:
        return f"pod's spec.nodeName is {bound}"
    selector = _obj(spec.get("nodeSelector"))
    for key, want in selector.items():
        if node.labels.get(str(key)) != want:
            return f"node's labels do not match the pod's nodeSelector {key}={want}"
    affinity = _obj(_obj(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None and not matches_node_selector(_obj(required), node):
        return "node does not match the pod's required node affinity"
    taint = untolerated_taint(_list(spec.get("tolerations")), node.taints)
    if taint is not None:
        return f"node has taint {taint.key}={taint.value}:{taint.effect} that the pod does not tolerate"
    return None


def matches_node_selector(selector: JsonObj, node: NodeFacts) -> bool:
    """A core/v1 NodeSelector: any of its terms holds (no terms: no node)."""
    return any(_term_matches(_obj(t), node) for t in _list(selector.get("nodeSelectorTerms")))


def _term_matches(term: JsonObj, node: NodeFacts) -> bool:
    expressions, fields = _list(term.get("matchExpressions")), _list(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    fields_of_node = {NODE_NAME_FIELD: node.name}
    return all(_label_requirement(_obj(r), node.labels) for r in expressions) and all(
        _field_requirement(_obj(r), fields_of_node) for r in fields
    )


def _label_requirement(req: JsonObj, labels: Mapping[str, str]) -> bool:
    key, op, raw = req.get("key"), str(req.get("operator")), req.get("values") or []
    if not isinstance(key, str) or not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        return False
    values: list[str] = raw
    have = labels.get(key)
    if op in ("In", "NotIn"):
        if not values:
            return False  # malformed: the term matches nothing
        return (have in values) if op == "In" else (have is None or have not in values)
    if op in ("Exists", "DoesNotExist"):
        if values:
            return False
        return (have is not None) is (op == "Exists")
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            return False
        bound, value = _int64(values[0]), _int64(have)
        if bound is None or value is None:
            return False
        return value > bound if op == "Gt" else value < bound
    return False


def _field_requirement(req: JsonObj, fields: Mapping[str, str]) -> bool:
    key, op, values = req.get("key"), req.get("operator"), req.get("values")
    if not isinstance(key, str) or key not in fields or op not in ("In", "NotIn"):
        return False  # only metadata.name, In or NotIn, is a node field selector
    if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
        return False
    return (fields[key] == values[0]) is (op == "In")


def untolerated_taint(tolerations: list[Any], taints: tuple[Taint, ...]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates, or None."""
    tols = [t for t in tolerations if isinstance(t, dict)]
    for taint in taints:
        if taint.effect in HARD_EFFECTS and not any(tolerates(t, taint) for t in tols):
            return taint
    return None


def tolerates(toleration: JsonObj, taint: Taint) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.effect:
        return False
    if key and key != taint.key:
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == taint.value
    return False


def _int64(raw: str | None) -> int | None:
    if raw is None or not _INT.fullmatch(raw):
        return None
    n = int(raw)
    return n if _INT64[0] <= n <= _INT64[1] else None


def _obj(value: Any) -> JsonObj:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
