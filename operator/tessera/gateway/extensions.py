"""Triton's extensions of the Open Inference Protocol that the gateway serves, so Triton's own clients and
tools (tritonclient, its performance analyzer, Model Analyzer) work against a ModelDeployment:

* **model configuration** — ``GET /v2/models/{name}[/versions/{v}]/config``, gRPC ``ModelConfig``: the
  model's inputs and outputs (from its workers' metadata), its batching limit and how its batches are
  formed, in the shape of Triton's model configuration;
* **statistics** — ``GET /v2/models[/{name}[/versions/{v}]]/stats``, gRPC ``ModelStatistics``: counts
  and cumulative durations since the gateway started, per model and per batch size;
* **model repository** — ``POST /v2/repository/index``, gRPC ``RepositoryIndex``: every served model
  and whether it is ready. Loading and unloading are refused with a reason: a ModelDeployment decides
  what the gateway serves.

The HTTP answers are JSON with numbers (as Triton writes them); the gRPC ones are the same content as
the messages of ``oip/triton_extensions.proto`` (built from the JSON with ``json_format.ParseDict``,
one source for both fronts).

What the configuration says, for a gateway model:

* ``max_batch_size`` is the most requests the model's batch scheduler puts in one batch (``max_batch``,
  or the largest of ``batch_sizes`` for orloj and clockwork) when every input and output has a
  variable first (batch) dimension; ``dims`` then leave that dimension out, as in Triton. A model whose
  shapes do not start with a batch dimension reports 0 and whole shapes.
* ``dynamic_batching`` is present (the gateway forms batches); ``preferred_batch_size`` lists
  ``batch_sizes`` for the policies that choose among them, ``max_queue_delay_microseconds`` is the
  timeout policy's delay (0 for the others, which plan per request against its deadline).
* ``instance_group`` is one group of ``KIND_MODEL`` with a count of the model's workers.
* ``parameters`` carry Tessera's own: ``tessera.policy``, ``tessera.slo_seconds``,
  ``tessera.namespace``.

What the statistics count (Triton's definitions, applied to the gateway's path):

* ``success`` / ``fail``: requests answered 200 / otherwise (dropped, expired, refused by the model),
  with the time from arrival at the gateway to the answer;
* ``queue``: time waiting for the batch scheduler; ``compute_input``: the gateway building the batch's
  request to the worker; ``compute_infer``: the worker's round trip (transfer, decoding, execution,
  encoding); ``compute_output``: slicing the worker's answer into each request's outputs;
* ``inference_count``: rows of the successful requests (a request of batch dimension 4 counts 4);
  ``execution_count``: batches the workers ran; ``batch_stats``: those executions by their rows;
* ``cache_hit`` / ``cache_miss`` stay 0: the gateway has no response cache.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NS_PER_S = 1_000_000_000
# The only version a served model has (tessera.gateway.protocol.MODEL_VERSIONS).
VERSION = "1"
STATE_READY = "READY"
STATE_UNAVAILABLE = "UNAVAILABLE"
EXTENSIONS = ("model_configuration", "statistics", "model_repository")


@dataclass
class Duration:
    """How many times something happened and how long it took in all (Triton's StatisticDuration)."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += max(0, round(seconds * NS_PER_S))

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchDurations:
    """Executions of one batch size: preparing, running and taking apart (Triton's InferBatchStatistics)."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class InferStats:
    """A model's counters since the gateway started, in the statistics extension's terms."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchDurations] = field(default_factory=dict)

    def succeeded(
        self, rows: int, total: float, queue: float, compute_input: float, compute_infer: float, output: float
    ) -> None:
        """A request answered 200: its rows and where its time went (seconds)."""
        self.success.add(total)
        self.queue.add(queue)
        self.compute_input.add(compute_input)
        self.compute_infer.add(compute_infer)
        self.compute_output.add(output)
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)

    def failed(self, total: float) -> None:
        """A request answered with an error after ``total`` seconds."""
        self.fail.add(total)
        self.last_inference_ms = int(time.time() * 1000)

    def executed(self, rows: int, compute_input: float, compute_infer: float, output: float) -> None:
        """One batch a worker ran, of ``rows`` rows in all."""
        self.execution_count += 1
        b = self.batches.setdefault(rows, BatchDurations())
        b.compute_input.add(compute_input)
        b.compute_infer.add(compute_infer)
        b.compute_output.add(output)

    def json(self, name: str) -> dict[str, Any]:
        """The model's entry of a statistics answer (``model_stats[i]``)."""
        stats = {phase: getattr(self, phase).json() for phase in _PHASES}
        stats["cache_hit"] = stats["cache_miss"] = Duration().json()
        return {
            "name": name,
            "version": VERSION,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": stats,
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.json(),
                    "compute_infer": b.compute_infer.json(),
                    "compute_output": b.compute_output.json(),
                }
                for size, b in sorted(self.batches.items())
            ],
        }


def data_type(datatype: str) -> str:
    """A v2 tensor datatype as a model configuration's (``FP32`` → ``TYPE_FP32``; BYTES is TYPE_STRING)."""
    if datatype == "BYTES":
        return "TYPE_STRING"
    known = {
        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
        "FP16", "FP32", "FP64", "BF16",
    }  # fmt: skip
    return f"TYPE_{datatype}" if datatype in known else "TYPE_INVALID"


def _shape(t: Mapping[str, Any]) -> list[int]:
    shape = t.get("shape")
    return [int(d) for d in shape] if isinstance(shape, list) else []


def model_config(
    name: str,
    metadata: Mapping[str, Any],
    *,
    max_batch: int,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_delay_s: float = 0.0,
    instances: int,
    parameters: Mapping[str, str],
) -> dict[str, Any]:
    """A model's configuration in Triton's JSON form (the module docstring says what each field means).

    ``metadata`` is the model's v2 metadata (inputs and outputs as its workers describe them; none
    before a worker was ready). ``max_batch`` is the scheduler's largest batch, 0 for a model the
    gateway does not batch."""
    inputs, outputs = list(metadata.get("inputs") or []), list(metadata.get("outputs") or [])
    batching = max_batch > 0 and all(_shape(t)[:1] == [-1] for t in inputs + outputs)

    def dims(t: Mapping[str, Any]) -> list[int]:
        return _shape(t)[1:] if batching else _shape(t)

    config: dict[str, Any] = {
        "name": name,
        "platform": str(metadata.get("platform") or "tessera-gateway"),
        "backend": "tessera",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch if batching else 0,
        "input": [
            {
                "name": t["name"],
                "data_type": data_type(str(t.get("datatype"))),
                "format": "FORMAT_NONE",
                "dims": dims(t),
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": False,
            }
            for t in inputs
        ],
        "output": [
            {
                "name": t["name"],
                "data_type": data_type(str(t.get("datatype"))),
                "dims": dims(t),
                "label_filename": "",
                "is_shape_tensor": False,
            }
            for t in outputs
        ],
        "instance_group": [{"name": name, "kind": "KIND_MODEL", "count": instances, "gpus": []}],
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
    }
    if batching:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(preferred_batch_sizes),
            "max_queue_delay_microseconds": round(max_queue_delay_s * 1_000_000),
            "preserve_ordering": False,
        }
    return config


def repository_index(models: Iterable[tuple[str, bool]], *, ready_only: bool) -> list[dict[str, str]]:
    """The repository index: (name, ready) of every served model → Triton's entries, sorted by name."""
    return [
        {
            "name": name,
            "version": VERSION,
            "state": STATE_READY if ready else STATE_UNAVAILABLE,
            "reason": "" if ready else "no worker of the model answers its readiness check",
        }
        for name, ready in sorted(models)
        if ready or not ready_only
    ]


MODEL_CONTROL_REFUSED = (
    "the gateway serves the models of its ModelDeployments and does not load or unload models on "
    "request; create, change or delete the ModelDeployment instead"
)
REASON_MODEL_CONTROL = "model-control-disabled"
