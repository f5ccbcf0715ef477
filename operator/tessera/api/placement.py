"""Schema of the Pod annotation `tessera.io/placement`, written by the operator (auction or plan result).

JSON object: {"node", "gpuIndices"}. The extender only lets the pod onto that node and those GPUs.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class PlacementAnnotationError(ValueError):
    """A `tessera.io/placement` annotation that cannot be used, with the reason."""


class PlacementAnnotation(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    node: str = Field(min_length=1)
    gpu_indices: list[int] = Field(alias="gpuIndices", min_length=1)

    @field_validator("gpu_indices")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(i < 0 for i in v):
            raise ValueError("gpuIndices must be distinct and >= 0")
        return v

    def to_annotation(self) -> str:
        return json.dumps(self.model_dump(by_alias=True), separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str, *, where: str = "pod") -> PlacementAnnotation:
        try:
            return cls.model_validate_json(raw)
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise PlacementAnnotationError(
                f"{where}: tessera.io/placement is malformed: {loc} {first['msg']}"
            ) from err
