"""The JSON Schema of `tessera simulate` scenario files, built from the input models the loaders use.

One document for every kind: a `oneOf` over the kinds, told apart by `kind` (a file without one is a
training scenario). Published as docs/scenario.schema.json by hack/gen-scenario-schema.py, so an editor
with a YAML language server can check a scenario while it is written.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from tessera.sim.orion.scenario import OrionFile
from tessera.sim.packing.scenario import PackingFile
from tessera.sim.serving.placement_scenario import PlacementFile
from tessera.sim.serving.scenario import ServingFile
from tessera.sim.training.scenario import TrainingFile
from tessera.sim.training.trace import TraceFile
from tessera.sim.tuning.scenario import TuningFile

SCENARIO_MODELS = (TrainingFile, TuningFile, ServingFile, PlacementFile, PackingFile, OrionFile)
SCHEMA_ID = "https://tessera.dev/schemas/scenario.schema.json"


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every scenario file validates against."""
    union = Annotated[Union[SCENARIO_MODELS], Field(discriminator="kind")]  # type: ignore[valid-type]  # noqa: UP007
    schema = TypeAdapter(union).json_schema(mode="validation")
    for model in SCENARIO_MODELS[1:]:  # only a training scenario may leave `kind` out
        node = schema["$defs"][model.__name__]
        node["required"] = sorted({*node.get("required", []), "kind"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Tessera simulator scenario",
        "description": "A `tessera simulate` scenario file; `kind` picks the simulator (default: training).",
        **schema,
    }


def trace_schema() -> dict[str, Any]:
    """The JSON Schema of a training trace YAML (`trace: {file: ...}`)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Tessera training trace",
        **TraceFile.model_json_schema(mode="validation"),
    }


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
