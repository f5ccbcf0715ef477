"""Schema of the Node annotation `tessera.io/gpus`, written by the node agent and read by the extender.

A JSON list, one object per physical GPU: {"uuid", "index", "model", "memoryMiB", "healthy"}.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class GpuInventoryError(ValueError):
    """A `tessera.io/gpus` annotation that cannot be used, with the reason."""


class GpuInfo(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    uuid: str = Field(min_length=1)
    index: int = Field(ge=0)
    model: str = ""
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    healthy: bool = True


_ADAPTER: TypeAdapter[list[GpuInfo]] = TypeAdapter(list[GpuInfo])


def parse_node_gpus(raw: str, *, node: str = "node") -> list[GpuInfo]:
    """Parse and check the annotation: valid JSON, each entry well-formed, indices and UUIDs unique."""
    try:
        gpus = _ADAPTER.validate_python(json.loads(raw))
    except json.JSONDecodeError as err:
        raise GpuInventoryError(f"{node}: tessera.io/gpus is not JSON ({err})") from err
    except ValidationError as err:
        raise GpuInventoryError(f"{node}: tessera.io/gpus is malformed: {err.errors()[0]['msg']}") from err
    if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
        raise GpuInventoryError(f"{node}: tessera.io/gpus repeats a GPU index or UUID")
    return sorted(gpus, key=lambda g: g.index)


def dump_node_gpus(gpus: list[GpuInfo]) -> str:
    return json.dumps([g.model_dump(by_alias=True) for g in gpus], separators=(",", ":"))
