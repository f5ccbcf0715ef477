"""What a Kubernetes API server does with a CRD's schema, reproduced offline for the tests.

Defaulting, OpenAPI validation with strict field validation (unknown fields rejected, as
`kubectl apply` does by default) and the `x-kubernetes-validations` CEL rules, evaluated with
cel-python. Kubernetes' CEL list library adds `isSorted()` and `indexOf()`; they are registered here the same way.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import celpy
import jsonschema
from celpy import celtypes

JSON = dict[str, Any]


def _format(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def apply_defaults(value: Any, schema: JSON) -> Any:
    """Fill in `default`s the way the API server does: only inside objects that are present."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(v, schema["items"]) for v in value]
    return value


def strict(schema: JSON) -> JSON:
    """Close every object that lists its properties and does not preserve unknown fields."""
    schema = copy.deepcopy(schema)

    def visit(node: JSON) -> None:
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for sub in node.get("properties", {}).values():
            visit(sub)
        if isinstance(node.get("items"), dict):
            visit(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"])

    visit(schema)
    return schema


def openapi_errors(obj: JSON, schema: JSON) -> list[tuple[str, str]]:
    """(path, message) from OpenAPI v3.0 validation (draft-4 semantics: boolean exclusiveMinimum)."""
    validator = jsonschema.Draft4Validator(strict(schema))
    out = []
    for err in validator.iter_errors(apply_defaults(obj, schema)):
        path = _format(list(err.absolute_path))
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            out.extend((_format([*err.absolute_path, k]), "unknown field") for k in extra)
        elif err.validator == "required":
            out.append((_format([*err.absolute_path, err.message.split("'")[1]]), err.message))
        else:
            out.append((path, err.message))
    return out


def _is_sorted(values: celtypes.ListType) -> celtypes.BoolType:
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(values)))


def _index_of(values: celtypes.ListType, item: Any) -> celtypes.IntType:
    return celtypes.IntType(next((i for i, v in enumerate(values) if v == item), -1))


_ENV = celpy.Environment()


def cel_errors(obj: JSON, schema: JSON) -> list[tuple[str, str]]:
    """(path + fieldPath, message) for every CEL rule that fails, after defaulting."""
    out: list[tuple[str, str]] = []

    def visit(value: Any, node: JSON, path: list[Any]) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            program = _ENV.program(
                _ENV.compile(rule["rule"]), functions={"isSorted": _is_sorted, "indexOf": _index_of}
            )
            result = program.evaluate({"self": celpy.json_to_cel(value)})
            if result is not True and result != celtypes.BoolType(True):
                out.append((_format(path) + rule.get("fieldPath", ""), rule["message"]))
        if isinstance(value, dict):
            for key, sub in node.get("properties", {}).items():
                if key in value:
                    visit(value[key], sub, [*path, key])
        elif isinstance(value, list) and "items" in node:
            for i, item in enumerate(value):
                visit(item, node["items"], [*path, i])

    visit(apply_defaults(obj, schema), schema, [])
    return out
