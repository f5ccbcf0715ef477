"""Shared building blocks of the resource models: wire naming, cross-field rules, pod templates.

Every model here speaks camelCase on the wire and snake_case in Python, rejects unknown fields, and
declares its cross-field rules once (`CrossFieldRule`): the same rule list becomes a pydantic check and
a CRD `x-kubernetes-validations` CEL rule, so `tessera validate` and a real API server agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Acronyms kept upper-case on the wire (maxGPUs, memoryMiB, sloScale → SLO only as a whole word part).
_ACRONYMS = {"Gpu": "GPU", "Gpus": "GPUs", "Mib": "MiB", "Slo": "SLO", "Uri": "URI", "Mps": "MPS"}
_ACRONYM_RE = re.compile(r"(Gpus|Gpu|Mib|Slo|Uri|Mps)(?=[A-Z]|$)")

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""RFC 1123 label: names of jobs and trials become parts of pod names."""

# Upper bounds of sizes and durations, carried into the CRDs as `maximum`: far past any real workload, small
# enough that every plan, sum and simulation over them stays finite and quick.
MAX_GPUS = 4096
"""GPUs one App, job, trial or group may ask for."""
MAX_ITERATIONS = 10**12
"""Iterations of one job or trial."""
MAX_SECONDS = 10 * 365 * 86400
"""Any duration in seconds (ten years)."""
MAX_MIB = 1 << 24
"""Memory of one GPU in MiB (16 TiB; the extender's bound too)."""


def wire_name(field_name: str) -> str:
    """snake_case → camelCase with units and acronyms spelled as users expect (max_gpus → maxGPUs)."""
    camel = to_camel(field_name)
    return _ACRONYM_RE.sub(lambda m: _ACRONYMS[m.group(1)], camel)


@dataclass(frozen=True)
class CrossFieldRule:
    """One rule over several fields of a model, enforced twice from one declaration.

    `cel` is the Kubernetes CEL expression (evaluated with `self` bound to this object after the API
    server applied schema defaults); `check` is the same predicate in Python over the parsed model.
    `field_path` (JSONPath relative to the object, e.g. ".lane.memoryMiB") is where the error points.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""


def unique_by(items: str, key: str, message: str) -> CrossFieldRule:
    """The rule that no two elements of the list field `items` share `key` (one-word names, the same on
    the wire and in Python)."""
    return CrossFieldRule(
        cel=f"self.{items}.all(x, self.{items}.exists_one(y, y.{key} == x.{key}))",
        message=message,
        check=lambda s: len({getattr(x, key) for x in getattr(s, items)}) == len(getattr(s, items)),
        field_path=f".{items}",
    )


Timestamp = Annotated[datetime, Field(strict=False)]
"""An RFC 3339 time; accepted as a string, since that is how status comes back from the API server."""


class WireModel(BaseModel):
    """Base of every spec/status model: camelCase aliases, strict about unknown fields."""

    model_config = ConfigDict(
        alias_generator=wire_name,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        # Like the API server: "4.06e8" (a YAML 1.1 string) is not a number, "true" is not a boolean.
        strict=True,
        # NaN and infinity are refused at the field (JSON, and so the API server, cannot carry them).
        allow_inf_nan=False,
    )

    cross_field_rules: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cross_field_rules(self) -> Self:
        for rule in type(self).cross_field_rules:
            if not rule.check(self):
                raise PydanticCustomError(
                    "cross_field", rule.message, {"field_path": rule.field_path, "message": rule.message}
                )
        return self

    def to_wire(self) -> dict[str, Any]:
        """The object as Kubernetes stores it (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class OpenModel(BaseModel):
    """A Kubernetes type we embed but do not own: known fields typed, everything else kept as is."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")


class Container(OpenModel):
    """The parts of a core/v1 Container that Tessera relies on; other fields pass through untouched."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Container name.")
    image: str | None = Field(default=None, min_length=1, description="Container image.")


class PodSpec(OpenModel):
    """core/v1 PodSpec: only `containers` is checked here; the API server validates the rest."""

    containers: list[Container] = Field(min_length=1, description="At least one container.")


class PodTemplateSpec(OpenModel):
    """core/v1 PodTemplateSpec embedded in a resource; Tessera fills in scheduling fields itself."""

    metadata: dict[str, Any] | None = Field(default=None, description="Labels and annotations for the pods.")
    spec: PodSpec = Field(description="Pod spec of the workload's pods.")


class ObjectMeta(OpenModel):
    """metadata of a manifest; only the name is required offline."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    namespace: str | None = None


READY = "Ready"
"""The condition every kind carries (`kubectl wait --for=condition=Ready`); each status model's
`conditions` description says what it means for that kind."""


class Condition(WireModel):
    """A metav1.Condition-shaped status condition; lastTransitionTime moves only when status changes."""

    type: str = Field(min_length=1, description="Condition type, e.g. Ready or Admitted.")
    status: str = Field(pattern=r"^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason for the condition's status, e.g. WaitingForGPUs.",
    )
    message: str | None = Field(default=None, description="Human-readable detail.")
    last_transition_time: str | None = Field(
        default=None, description="RFC 3339 time the status last changed (True/False/Unknown)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this condition was computed from."
    )
