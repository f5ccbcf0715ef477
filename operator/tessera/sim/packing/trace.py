"""Alibaba's GPU-sharing trace (cluster-trace-gpu-v2023) as nodes and pod shapes for the packing experiment.

Node list: `sn, cpu_milli, memory_mib, gpu, model`; pod list: `name, cpu_milli, memory_mib, num_gpu, gpu_milli,
gpu_spec, ...` (`gpu_milli` < 1000 with one GPU is a share of it; `gpu_spec` lists allowed models, `|`-separated,
empty for any). The trace gives one GPU share per pod; it becomes the same fraction of the GPU's compute and
memory (Shape.share), so on this trace Tessera's two-dimensional lanes reduce to FGD's one dimension.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from tessera.policy.lanes.fragmentation import Shape

# GPU memory per model (MiB); the trace's own models G2/G3 are not public, their size is nominal. Pods ask for
# fractions, so these sizes only matter when a scenario mixes MiB requests in.
GPU_MEMORY_MIB = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 16384,
    "G3": 32768,
}
DEFAULT_GPU_MEMORY_MIB = 16384


class PackingTraceError(ValueError):
    """A trace file that cannot be read, naming the file, line and column."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    gpu_mib: int = 0  # GPU memory; 0: by model (GPU_MEMORY_MIB)

    @property
    def gpu_memory_mib(self) -> int:
        return self.gpu_mib or GPU_MEMORY_MIB.get(self.model, DEFAULT_GPU_MEMORY_MIB)


def _int(row: dict[str, str], col: str, where: str) -> int:
    raw = (row.get(col) or "").strip()
    try:
        value = int(float(raw))
    except ValueError:
        raise PackingTraceError(f"{where}: column {col!r} must be a number, got {raw!r}") from None
    if value < 0:
        raise PackingTraceError(f"{where}: column {col!r} must be >= 0, got {value}")
    return value


def _rows(path: Path, needed: tuple[str, ...]) -> list[tuple[str, dict[str, str]]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in needed if c not in (reader.fieldnames or [])]
            if missing:
                raise PackingTraceError(f"{path}: missing column(s) {', '.join(missing)}")
            return [(f"{path}:{i + 2}", row) for i, row in enumerate(reader)]
    except OSError as err:
        raise PackingTraceError(f"{path}: {err.strerror or err}") from None


def read_nodes(path: Path) -> list[NodeSpec]:
    out = []
    for where, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        out.append(
            NodeSpec(
                row["sn"],
                _int(row, "cpu_milli", where),
                _int(row, "memory_mib", where),
                _int(row, "gpu", where),
                (row.get("model") or "").strip(),
            )
        )
    if not out:
        raise PackingTraceError(f"{path}: no nodes")
    return out


def read_pods(path: Path) -> list[Shape]:
    out = []
    for where, row in _rows(path, ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        gpus, milli = _int(row, "num_gpu", where), _int(row, "gpu_milli", where)
        if gpus and not 0 < milli <= 1000:
            raise PackingTraceError(f"{where}: gpu_milli must be in 1..1000 for a GPU pod, got {milli}")
        spec = (row.get("gpu_spec") or "").strip()
        shape = Shape.share(gpus, milli, _int(row, "cpu_milli", where), _int(row, "memory_mib", where))
        if spec and gpus:
            models = frozenset(m.strip() for m in spec.split("|") if m.strip())
            shape = Shape(
                shape.gpus,
                shape.compute,
                0.0,
                shape.gpu_memory_frac,
                shape.cpu_milli,
                shape.memory_mib,
                models,
            )
        out.append(shape)
    if not out:
        raise PackingTraceError(f"{path}: no pods")
    return out
