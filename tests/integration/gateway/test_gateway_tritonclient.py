"""NVIDIA's tritonclient, the reference Open Inference Protocol client, with its defaults against the
gateway on loopback: health, metadata, inference with binary and with JSON tensors, and async calls,
over HTTP and over gRPC; and Triton's model configuration, statistics and repository index extensions,
which Triton's own tools (its performance analyzer among them) call first."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .gateway_harness import MODEL, WIDTH, payloads
from .inproc import Stack, stack
from .test_gateway_protocol import gateway_config, reference

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


@pytest.fixture(scope="module")
def served(demo_model: Path) -> Iterator[Stack]:
    with stack() as s:
        workers = [s.add_worker(demo_model), s.add_worker(demo_model)]
        s.start_gateway(gateway_config(workers), grpc=True)
        yield s


def arrays(body: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(body["inputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
    n = np.asarray(body["inputs"][1]["data"], dtype=np.int64).reshape(1, 1)
    return x, n


def inputs(module: Any, body: dict[str, Any], *, binary: bool | None = None) -> list[Any]:
    x, n = arrays(body)
    out = [module.InferInput("x", [1, WIDTH], "FP32"), module.InferInput("n", [1, 1], "INT64")]
    for t, a in zip(out, (x, n), strict=True):
        if binary is None:
            t.set_data_from_numpy(a)  # the client's default
        else:
            t.set_data_from_numpy(a, binary_data=binary)
    return out


@pytest.fixture(scope="module")
def http(served: Stack) -> Iterator[Any]:
    client = httpclient.InferenceServerClient(served.url.removeprefix("http://"), concurrency=4)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(served: Stack) -> Iterator[Any]:
    client = grpcclient.InferenceServerClient(served.grpc_target)
    yield client
    client.close()


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_health_and_metadata(front: str, http: Any, grpc_client: Any) -> None:
    client = http if front == "http" else grpc_client
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready(MODEL, "2") if front == "http" else True
    meta = client.get_model_metadata(MODEL)
    if front == "grpc":
        names = [(t.name, t.datatype, list(t.shape)) for t in meta.inputs]
        assert meta.name == MODEL and list(meta.versions) == ["1"]
    else:
        names = [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]]
        assert meta["name"] == MODEL and meta["versions"] == ["1"]
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert names == [("x", "FP32", [-1, WIDTH]), ("n", "INT64", [-1, 1])]


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_infer_with_the_clients_defaults(front: str, http: Any, grpc_client: Any) -> None:
    module, client = (httpclient, http) if front == "http" else (grpcclient, grpc_client)
    for i, body in enumerate(payloads("short", 3, seed=20)):
        version = "1" if i == 2 else ""  # a versioned call too
        result = client.infer(MODEL, inputs(module, body), model_version=version)
        np.testing.assert_allclose(result.as_numpy("y"), reference(body), rtol=1e-3, atol=1e-3)


def test_http_infer_with_json_tensors_and_json_outputs(http: Any) -> None:
    body = payloads("short", 1, seed=21)[0]
    outputs = [httpclient.InferRequestedOutput("y", binary_data=False)]
    result = http.infer(MODEL, inputs(httpclient, body, binary=False), outputs=outputs)
    assert result.get_output("y")["datatype"] == "FP32" and "data" in result.get_output("y")
    np.testing.assert_allclose(result.as_numpy("y"), reference(body), rtol=1e-3, atol=1e-3)
    # Binary input, JSON output, and the reverse.
    result = http.infer(MODEL, inputs(httpclient, body, binary=True), outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("y"), reference(body), rtol=1e-3, atol=1e-3)
    result = http.infer(MODEL, inputs(httpclient, body, binary=False))
    np.testing.assert_allclose(result.as_numpy("y"), reference(body), rtol=1e-3, atol=1e-3)


def test_async_calls(http: Any, grpc_client: Any) -> None:
    bodies = payloads("long", 6, seed=22)
    pending = [http.async_infer(MODEL, inputs(httpclient, b)) for b in bodies]
    for req, body in zip(pending, bodies, strict=True):
        np.testing.assert_allclose(req.get_result().as_numpy("y"), reference(body), rtol=1e-3, atol=1e-3)

    results: dict[int, Any] = {}
    import threading

    done = threading.Event()

    def callback(i: int) -> Any:
        def cb(result: Any, error: Any) -> None:
            results[i] = error if error is not None else result
            if len(results) == len(bodies):
                done.set()

        return cb

    for i, b in enumerate(bodies):
        grpc_client.async_infer(MODEL, inputs(grpcclient, b), callback(i))
    assert done.wait(60), results
    for i, body in enumerate(bodies):
        assert not isinstance(results[i], Exception), results[i]
        np.testing.assert_allclose(results[i].as_numpy("y"), reference(body), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_errors_reach_the_client_as_decodable_messages(front: str, http: Any, grpc_client: Any) -> None:
    module, client = (httpclient, http) if front == "http" else (grpcclient, grpc_client)
    body = payloads("short", 1, seed=23)[0]
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer('a"b', inputs(module, body))
    bad = module.InferInput("x", [1, WIDTH // 2], "FP32")
    bad.set_data_from_numpy(np.zeros((1, WIDTH // 2), np.float32))
    n = module.InferInput("n", [1, 1], "INT64")
    n.set_data_from_numpy(np.array([[3]], np.int64))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer(MODEL, [bad, n])
    with pytest.raises(InferenceServerException, match="version"):
        client.infer(MODEL, inputs(module, body), model_version="2")


# --- Triton's extensions: model configuration, statistics, repository index ---------------------------


def test_model_configuration_over_http_and_grpc(http: Any, grpc_client: Any) -> None:
    """What Triton's tools read first: batching limit, inputs and outputs without the batch dimension."""
    config = http.get_model_config(MODEL)
    assert config["name"] == MODEL and config["max_batch_size"] == 8  # the timeout policy's max_batch
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [WIDTH]),
        ("n", "TYPE_INT64", [1]),
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("y", "TYPE_FP32", [WIDTH])]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20_000
    assert config["instance_group"] == [{"name": MODEL, "kind": "KIND_MODEL", "count": 2, "gpus": []}]
    assert config["parameters"]["tessera.policy"] == {"string_value": "timeout"}
    assert http.get_model_config(MODEL, "1") == config

    from tritonclient.grpc import model_config_pb2 as mc

    got = grpc_client.get_model_config(MODEL).config
    assert (got.name, got.max_batch_size) == (MODEL, 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in got.input] == [
        ("x", mc.TYPE_FP32, [WIDTH]),
        ("n", mc.TYPE_INT64, [1]),
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in got.output] == [("y", mc.TYPE_FP32, [WIDTH])]
    assert got.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert got.dynamic_batching.max_queue_delay_microseconds == 20_000
    assert (got.instance_group[0].kind, got.instance_group[0].count) == (mc.ModelInstanceGroup.KIND_MODEL, 2)
    assert got.parameters["tessera.slo_seconds"].string_value == "5"
    assert grpc_client.get_model_config(MODEL, as_json=True)["config"]["input"][0]["dims"] == [str(WIDTH)]


def _stats(front: str, http: Any, grpc_client: Any) -> dict[str, Any]:
    """The model's statistics as JSON numbers, from either front."""
    if front == "http":
        (entry,) = http.get_inference_statistics(MODEL)["model_stats"]
        return dict(entry)
    (entry,) = grpc_client.get_inference_statistics(MODEL, as_json=True)["model_stats"]

    def numbers(v: Any, key: str = "") -> Any:  # MessageToJson writes 64-bit integers as strings
        if isinstance(v, dict):
            return {k: numbers(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [numbers(x) for x in v]
        return int(v) if key not in ("name", "version") and isinstance(v, str) and v.isdigit() else v

    return dict(numbers(entry))


def _count(stats: dict[str, Any], phase: str) -> int:
    return int(stats["inference_stats"].get(phase, {}).get("count", 0))


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_statistics_count_requests_rows_and_batches(front: str, http: Any, grpc_client: Any) -> None:
    module, client = (httpclient, http) if front == "http" else (grpcclient, grpc_client)
    before = _stats(front, http, grpc_client)
    started_ms = time.time() * 1000
    bodies = payloads("short", 3, seed=24)
    for body in bodies:
        client.infer(MODEL, inputs(module, body))
    # One request of two rows: inference_count counts rows, success counts requests.
    pair = [module.InferInput("x", [2, WIDTH], "FP32"), module.InferInput("n", [2, 1], "INT64")]
    pair[0].set_data_from_numpy(np.ones((2, WIDTH), np.float32))
    pair[1].set_data_from_numpy(np.array([[2], [3]], np.int64))
    assert client.infer(MODEL, pair).as_numpy("y").shape == (2, WIDTH)
    bad = module.InferInput("x", [1, 3], "FP32")  # refused by the model: a failure
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    n = module.InferInput("n", [1, 1], "INT64")
    n.set_data_from_numpy(np.array([[1]], np.int64))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer(MODEL, [bad, n])
    after = _stats(front, http, grpc_client)

    assert (after["name"], after["version"]) == (MODEL, "1")
    assert _count(after, "success") - _count(before, "success") == 4
    assert _count(after, "fail") - _count(before, "fail") == 1
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert _count(after, phase) - _count(before, phase) == 4, phase
    assert after["inference_count"] - before["inference_count"] == 5
    ran = after["execution_count"] - before["execution_count"]
    assert 4 <= ran <= 5  # each request ran alone (sequential calls); the refused one may have run too
    succ = after["inference_stats"]["success"]
    assert succ["ns"] > before["inference_stats"]["success"]["ns"]
    # The worker's round trip is part of each request's time at the gateway.
    infer = after["inference_stats"]["compute_infer"]["ns"] - before["inference_stats"]["compute_infer"]["ns"]
    assert 0 < infer <= succ["ns"] - before["inference_stats"]["success"]["ns"]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before.get("batch_stats", [])}
    assert sizes.get(2, 0) - old.get(2, 0) >= 1 and sizes.get(1, 0) - old.get(1, 0) >= 3
    assert after["last_inference"] >= started_ms - 1000
    assert after["inference_stats"].get("cache_hit", {}).get("count", 0) == 0


def test_statistics_of_every_model_and_errors(http: Any, grpc_client: Any) -> None:
    assert [s["name"] for s in http.get_inference_statistics()["model_stats"]] == [MODEL]
    assert [s.name for s in grpc_client.get_inference_statistics().model_stats] == [MODEL]
    assert [s["name"] for s in http.get_inference_statistics(MODEL, "1")["model_stats"]] == [MODEL]
    for client in (http, grpc_client):
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_inference_statistics("nope")
        with pytest.raises(InferenceServerException, match="version"):
            client.get_inference_statistics(MODEL, "2")
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_model_config("nope")
        with pytest.raises(InferenceServerException, match="version"):
            client.get_model_config(MODEL, "2")


def test_repository_index_and_extensions_listed(http: Any, grpc_client: Any, served: Stack) -> None:
    entry = {"name": MODEL, "version": "1", "state": "READY", "reason": ""}
    assert http.get_model_repository_index() == [entry]
    index = grpc_client.get_model_repository_index()
    assert [(m.name, m.version, m.state, m.reason) for m in index.models] == [(MODEL, "1", "READY", "")]
    for meta in (http.get_server_metadata()["extensions"], grpc_client.get_server_metadata().extensions):
        assert {"model_configuration", "statistics", "model_repository", "binary_tensor_data"} <= set(meta)
    # Only ready models, as Triton's {"ready": true}; a malformed request is a 400 with a reason.
    for body, status in ((b'{"ready": true}', 200), (b"{", 400), (b'{"ready": "yes"}', 400)):
        req = urllib.request.Request(f"{served.url}/v2/repository/index", data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                got, answer = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            got, answer = err.code, json.loads(err.read())
        assert got == status, answer
        assert answer == [entry] if status == 200 else answer["reason"] == "bad-request"
    # Loading and unloading belong to ModelDeployments: refused with the reason, over both fronts.
    for client in (http, grpc_client):
        with pytest.raises(InferenceServerException, match="ModelDeployment"):
            client.load_model(MODEL)
        with pytest.raises(InferenceServerException, match="ModelDeployment"):
            client.unload_model(MODEL)
