"""Triton's extensions as the gateway writes them: the configuration's batching and shapes, the
statistics' counters, the repository index, and the .proto's messages against the ones Triton's clients
decode (tritonclient's), field by field and on the wire."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from tessera.gateway.extensions import InferStats, data_type, model_config, repository_index
from tessera.gateway.oip import triton_extensions_pb2 as ext

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

META = {
    "name": "m",
    "platform": "onnxruntime_onnx",
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "n", "datatype": "INT64", "shape": [-1, 1]},
    ],
    "outputs": [{"name": "y", "datatype": "FP16", "shape": [-1, 4, 4]}],
}


def config(meta: dict[str, Any] = META, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"max_batch": 8, "instances": 3, "parameters": {"tessera.policy": "orloj"}}
    return model_config("m", meta, **{**args, **kw})


def triton_message(name: str) -> Any:
    for module in (service_pb2, model_config_pb2):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"tritonclient has no message {name}")


def _pairs(ours: Any, theirs: Any, seen: set[str]) -> list[tuple[Any, Any]]:
    if ours.full_name in seen:
        return []
    seen.add(ours.full_name)
    out = [(ours, theirs)]
    for f in ours.fields:
        if f.message_type is not None and not f.message_type.GetOptions().map_entry:
            out += _pairs(f.message_type, theirs.fields_by_name[f.name].message_type, seen)
    return out


@pytest.mark.parametrize(
    "name",
    [
        "ModelConfigRequest",
        "ModelConfigResponse",
        "ModelStatisticsRequest",
        "ModelStatisticsResponse",
        "RepositoryIndexRequest",
        "RepositoryIndexResponse",
        "RepositoryModelLoadRequest",
        "RepositoryModelUnloadRequest",
    ],
)
def test_every_field_has_the_name_number_and_type_tritonclient_decodes(name: str) -> None:
    ours = getattr(ext, name).DESCRIPTOR
    for mine, theirs in _pairs(ours, triton_message(name).DESCRIPTOR, set()):
        assert mine.name == theirs.name
        for f in mine.fields:
            other = theirs.fields_by_name.get(f.name)
            assert other is not None, f"{mine.full_name}.{f.name} is not in Triton's message"
            assert (f.number, f.type, f.is_repeated) == (other.number, other.type, other.is_repeated), (
                f.full_name
            )
            if f.enum_type is not None:
                mine_values = {v.name: v.number for v in f.enum_type.values}
                assert mine_values.items() <= {v.name: v.number for v in other.enum_type.values}.items()


def test_a_configuration_decodes_in_tritonclients_message() -> None:
    msg = json_format.ParseDict(config(), ext.ModelConfig())
    theirs = model_config_pb2.ModelConfig.FromString(msg.SerializeToString())
    assert theirs.max_batch_size == 8 and theirs.platform == "onnxruntime_onnx"
    assert [(t.name, t.data_type, list(t.dims)) for t in theirs.input] == [
        ("x", model_config_pb2.TYPE_FP32, [16]),
        ("n", model_config_pb2.TYPE_INT64, [1]),
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in theirs.output] == [
        ("y", model_config_pb2.TYPE_FP16, [4, 4])
    ]
    assert theirs.version_policy.latest.num_versions == 1
    assert theirs.instance_group[0].count == 3
    assert theirs.parameters["tessera.policy"].string_value == "orloj"


def test_batching_limits_follow_the_scheduler_and_the_shapes() -> None:
    c = config(preferred_batch_sizes=[1, 2, 4], max_queue_delay_s=0.0025)
    assert c["max_batch_size"] == 8 and [t["dims"] for t in c["input"]] == [[16], [1]]
    assert c["dynamic_batching"] == {
        "preferred_batch_size": [1, 2, 4],
        "max_queue_delay_microseconds": 2500,
        "preserve_ordering": False,
    }
    # A tensor without a leading batch dimension: not batched, whole shapes, no dynamic batching.
    fixed = {**META, "outputs": [{"name": "y", "datatype": "FP32", "shape": [3, 4]}]}
    c = config(fixed)
    assert c["max_batch_size"] == 0 and [t["dims"] for t in c["input"]] == [[-1, 16], [-1, 1]]
    assert "dynamic_batching" not in c
    # Before any worker described the model: no tensors yet, the scheduler's limit stands.
    c = config({"name": "m"})
    assert (c["input"], c["output"], c["max_batch_size"], c["platform"]) == ([], [], 8, "tessera-gateway")
    assert config(max_batch=0)["max_batch_size"] == 0


def test_datatypes() -> None:
    assert [data_type(t) for t in ("FP32", "INT8", "BOOL", "BYTES", "BF16", "X")] == [
        "TYPE_FP32",
        "TYPE_INT8",
        "TYPE_BOOL",
        "TYPE_STRING",
        "TYPE_BF16",
        "TYPE_INVALID",
    ]


def test_statistics_count_requests_rows_and_executions() -> None:
    s = InferStats()
    s.succeeded(2, total=0.010, queue=0.004, compute_input=0.001, compute_infer=0.004, output=0.001)
    s.succeeded(1, total=0.020, queue=0.0, compute_input=0.0, compute_infer=0.02, output=0.0)
    s.failed(0.5)
    s.executed(3, 0.001, 0.004, 0.001)
    s.executed(1, 0.0, 0.002, 0.0)
    out = s.json("m")
    assert (out["inference_count"], out["execution_count"]) == (3, 2)
    stats = out["inference_stats"]
    assert stats["success"] == {"count": 2, "ns": 30_000_000}
    assert stats["fail"] == {"count": 1, "ns": 500_000_000}
    assert stats["queue"] == {"count": 2, "ns": 4_000_000}
    assert stats["cache_hit"] == {"count": 0, "ns": 0}
    assert [b["batch_size"] for b in out["batch_stats"]] == [1, 3]
    assert out["batch_stats"][1]["compute_infer"] == {"count": 1, "ns": 4_000_000}
    msg = json_format.ParseDict({"model_stats": [out]}, ext.ModelStatisticsResponse())
    theirs = service_pb2.ModelStatisticsResponse.FromString(msg.SerializeToString())
    assert theirs.model_stats[0].inference_stats.success.ns == 30_000_000
    assert theirs.model_stats[0].batch_stats[1].batch_size == 3
    assert theirs.model_stats[0].last_inference > 0


def test_repository_index_lists_unavailable_models_unless_only_ready_ones_are_asked() -> None:
    models = [("b", False), ("a", True)]
    full = repository_index(models, ready_only=False)
    assert [(m["name"], m["state"]) for m in full] == [("a", "READY"), ("b", "UNAVAILABLE")]
    assert full[1]["reason"] and not full[0]["reason"]
    assert [m["name"] for m in repository_index(models, ready_only=True)] == ["a"]
    msg = json_format.ParseDict({"models": full}, ext.RepositoryIndexResponse())
    theirs = service_pb2.RepositoryIndexResponse.FromString(msg.SerializeToString())
    assert [(m.name, m.state) for m in theirs.models] == [("a", "READY"), ("b", "UNAVAILABLE")]
