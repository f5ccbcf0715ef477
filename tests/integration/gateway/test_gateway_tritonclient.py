"""NVIDIA's tritonclient, the reference Open Inference Protocol client, with its defaults against the
gateway on loopback: health, metadata, inference with binary and with JSON tensors, and async calls,
over HTTP and over gRPC."""

from __future__ import annotations

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
