"""Bundled model zoos for the multi-GPU serving simulator: Symphony's Table 3 (1080Ti, 35 models).

``operator/tessera/sim/data/zoos/serving-symphony-zoo.yaml`` holds each model's ℓ(b) = αb + β and SLO with the
line of the seed text it comes from; :func:`load_zoo` validates it and returns
:class:`~tessera.sim.serving.cluster_sim.ServedModel` rows in the table's order.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tessera.policy.serving.common import LinearProfile
from tessera.sim.serving.cluster_sim import ServedModel

SYMPHONY_ZOO = "serving-symphony-zoo.yaml"


class ZooModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    alpha_ms: float = Field(gt=0)
    beta_ms: float = Field(ge=0)
    slo_ms: float = Field(gt=0)


class Zoo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str
    max_batch: int = Field(ge=1)
    models: list[ZooModel] = Field(min_length=1)

    def served(self) -> list[ServedModel]:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"zoo {self.name}: model names repeat")
        return [
            ServedModel(
                m.name, LinearProfile(m.alpha_ms / 1e3, m.beta_ms / 1e3, self.max_batch), m.slo_ms / 1e3
            )
            for m in self.models
        ]


def load_zoo(path: str | Path | None = None) -> Zoo:
    """Read and validate a zoo file (default: the bundled Symphony Table 3)."""
    if path is None:
        text = (
            resources.files("tessera.sim").joinpath("data", "zoos", SYMPHONY_ZOO).read_text(encoding="utf-8")
        )
    else:
        text = Path(path).read_text(encoding="utf-8")
    return Zoo.model_validate(yaml.safe_load(text))


def symphony_zoo() -> list[ServedModel]:
    """Symphony's Table 3 models (seconds), as Fig. 7a's mixed-model setup serves them."""
    return load_zoo().served()
