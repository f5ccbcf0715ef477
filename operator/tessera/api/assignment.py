"""Schema of the Pod annotation `tessera.io/assignment`, written by the extender at bind, read by the agent.

JSON object: {"node", "gpuUUIDs", "gpuIndices", "laneId", "memoryMiB" (per GPU), "computePercent"}.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class AssignmentError(ValueError):
    """A `tessera.io/assignment` annotation that cannot be used, with the reason."""


class Assignment(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    node: str = Field(min_length=1)
    gpu_uuids: list[str] = Field(alias="gpuUUIDs", min_length=1)
    gpu_indices: list[int] = Field(alias="gpuIndices", default_factory=list)
    lane_id: str = Field(alias="laneId", min_length=1)
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    compute_percent: int = Field(alias="computePercent", ge=1, le=100)

    @model_validator(mode="after")
    def _same_length(self) -> Assignment:
        if self.gpu_indices and len(self.gpu_indices) != len(self.gpu_uuids):
            raise ValueError("gpuIndices and gpuUUIDs differ in length")
        return self

    def to_annotation(self) -> str:
        return json.dumps(self.model_dump(by_alias=True), separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str, *, where: str = "pod") -> Assignment:
        try:
            return cls.model_validate_json(raw)
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise AssignmentError(
                f"{where}: tessera.io/assignment is malformed: {loc} {first['msg']}"
            ) from err
