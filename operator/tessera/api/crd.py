"""CustomResourceDefinitions generated from the models (the only source of the CRD schemas).

pydantic's JSON schema is turned into a Kubernetes *structural* schema: $refs inlined, Optional
collapsed to the plain type, every node typed, `x-kubernetes-preserve-unknown-fields` only on embedded
Kubernetes types and free-form maps, cross-field rules as `x-kubernetes-validations` (CEL), and
defaults spelled out so the API server applies them before the rules run.
"""

from __future__ import annotations

import copy
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from tessera.api import contract
from tessera.api.base import WireModel
from tessera.api.resources import KINDS, ResourceKind

JSON = dict[str, Any]

_DROP = {"title", "discriminator"}


def _reachable(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Models used (transitively) by `root`'s fields, keyed as pydantic names them in $defs."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if found.get(tp.__name__) is tp:
                return
            found[tp.__name__] = tp
            for info in tp.model_fields.values():
                visit(info.annotation)
        for arg in get_args(tp):
            visit(arg)

    visit(root)
    return found


def _rules(model: type[BaseModel]) -> list[JSON]:
    if not issubclass(model, WireModel):
        return []
    rules = []
    for rule in model.cross_field_rules:
        entry: JSON = {"message": rule.message, "rule": rule.cel}
        if rule.field_path:
            entry["fieldPath"] = rule.field_path
        rules.append(entry)
    return rules


def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Wire-named defaults of fields built by a factory (pydantic leaves them out of the schema)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            if isinstance(value, WireModel):
                value = value.to_wire()
            out[info.alias or name] = value
    return out


class _Structurer:
    def __init__(
        self, defs: dict[str, JSON], models: dict[str, type[BaseModel]], with_defaults: bool
    ) -> None:
        self.defs = defs
        self.models = models
        self.with_defaults = with_defaults

    def convert(self, node: JSON) -> JSON:
        node = dict(node)
        extra = {k: node.pop(k) for k in ("description", "default") if k in node}
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            out = self._model(name)
        elif "allOf" in node and len(node["allOf"]) == 1:
            out = self.convert(node.pop("allOf")[0])
        elif "anyOf" in node:
            options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise TypeError(f"a union of several types cannot be structural: {options}")
            out = self.convert(options[0])
        else:
            out = self._plain(node)
        if "description" in extra:
            out["description"] = extra["description"]
        if self.with_defaults and extra.get("default") is not None:
            out["default"] = extra["default"]
        return out

    def _model(self, name: str) -> JSON:
        out = self.convert(self.defs[name])
        model = self.models[name]
        if rules := _rules(model):
            out["x-kubernetes-validations"] = rules
        if self.with_defaults:
            for key, value in _defaults(model).items():
                if key in out.get("properties", {}):
                    out["properties"][key]["default"] = value
        return out

    def _plain(self, node: JSON) -> JSON:
        out: JSON = {}
        for key, value in node.items():
            if key in _DROP:
                continue
            if key == "properties":
                out[key] = {k: self.convert(v) for k, v in value.items()}
            elif key == "items":
                out[key] = self.convert(value)
            elif key == "additionalProperties":
                if value is True:
                    out["x-kubernetes-preserve-unknown-fields"] = True
                elif isinstance(value, dict) and value:
                    out[key] = self.convert(value)
                # False: properties are closed; the API server prunes or (strict) rejects unknown fields.
            elif key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                # JSON Schema 2020 bound → OpenAPI v3.0 (Kubernetes): a bound plus a boolean flag.
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            else:
                out[key] = value
        if "type" not in out:
            # Any: a free-form value (tuner params, hyper-parameters).
            out["x-kubernetes-preserve-unknown-fields"] = True
            out["type"] = "object"
        if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True
        return out


def structural_schema(model: type[BaseModel], *, with_defaults: bool = True) -> JSON:
    """OpenAPI v3 structural schema of one model, as a CRD version's schema wants it."""
    raw = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    defs = raw.pop("$defs", {})
    defs[model.__name__] = raw
    models = _reachable(model)
    if set(defs) != set(models):
        raise TypeError(f"two models share a name under {model.__name__}: {sorted(set(defs) ^ set(models))}")
    return _Structurer(defs, models, with_defaults)._model(model.__name__)


def _status_schema(kind: ResourceKind) -> JSON:
    return structural_schema(kind.status_model, with_defaults=False)


def openapi_schema(kind: ResourceKind) -> JSON:
    """The full openAPIV3Schema of a kind's CRD."""
    return {
        "type": "object",
        "description": (kind.model.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(kind.spec_model),
            "status": _status_schema(kind),
        },
    }


def build_crd(kind: ResourceKind) -> JSON:
    """apiextensions.k8s.io/v1 CustomResourceDefinition for one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{contract.GROUP}",
            "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
        },
        "spec": {
            "group": contract.GROUP,
            "scope": kind.scope,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [contract.CATEGORY],
            },
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": c.name,
                            "type": c.type,
                            "jsonPath": c.json_path,
                            "description": c.description,
                        }
                        for c in kind.columns
                    ],
                    "schema": {"openAPIV3Schema": openapi_schema(kind)},
                }
            ],
        },
    }


def all_crds() -> dict[str, JSON]:
    """File name under crds/ → CRD, for every kind."""
    return {f"{contract.GROUP}_{k.plural}.yaml": copy.deepcopy(build_crd(k)) for k in KINDS.values()}


def render_yaml(crd: JSON) -> str:
    """Stable YAML text of a CRD (sorted keys, no line wrapping) as written to crds/."""
    header = "# Generated by hack/gen-crds from tessera.api; do not edit by hand.\n"
    return header + yaml.safe_dump(crd, sort_keys=True, allow_unicode=True, width=10_000)
