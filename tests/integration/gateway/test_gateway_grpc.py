"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``) beside HTTP, with a real
gRPC channel and the protocol's generated stub: same models, same queue, same answers and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tessera.gateway.oip import open_inference_grpc_pb2 as pb
from tessera.gateway.oip import open_inference_grpc_pb2_grpc as pb_grpc

from .gateway_harness import MODEL, WIDTH, payloads
from .inproc import Stack, stack
from .test_gateway_protocol import call, gateway_config, infer_url, post_json, reference

HTTP_TO_GRPC = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    503: grpc.StatusCode.UNAVAILABLE,
}


@pytest.fixture(scope="module")
def served(demo_model: Path) -> Iterator[Stack]:
    with stack() as s:
        workers = [s.add_worker(demo_model), s.add_worker(demo_model)]
        s.start_gateway(gateway_config(workers), grpc=True)
        yield s


@pytest.fixture(scope="module")
def stub(served: Stack) -> Iterator[Any]:
    with grpc.insecure_channel(served.grpc_target) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def grpc_request(body: dict[str, Any], *, raw: bool, model: str = MODEL, version: str = "") -> Any:
    """``body`` (a v2 JSON request of the demo model) as a ModelInferRequest."""
    req = pb.ModelInferRequest(model_name=model, model_version=version, id="r1")
    for t in body["inputs"]:
        dtype = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4"}[t["datatype"]]
        arr = np.asarray(t["data"], dtype=dtype)
        entry = req.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        elif t["datatype"] == "FP32":
            entry.contents.fp32_contents.extend(arr.tolist())
        elif t["datatype"] == "INT64":
            entry.contents.int64_contents.extend(arr.tolist())
        else:
            entry.contents.int_contents.extend(arr.tolist())
    return req


def test_health_and_metadata_match_http(served: Stack, stub: Any) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name=MODEL, version="1")).ready
    assert "binary_tensor_data" in stub.ServerMetadata(pb.ServerMetadataRequest()).extensions
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL))
    status, _, raw = call("GET", f"{served.url}/v2/models/{MODEL}")
    http_meta = json.loads(raw)
    assert status == 200
    assert meta.name == http_meta["name"] and list(meta.versions) == http_meta["versions"]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        (t["name"], t["datatype"], t["shape"]) for t in http_meta["inputs"]
    ]
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelMetadata(pb.ModelMetadataRequest(name='a"b'))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and 'a"b' in err.value.details()


@pytest.mark.parametrize("raw", [True, False], ids=["raw_input_contents", "typed_contents"])
def test_infer_gives_the_same_answer_as_http(served: Stack, stub: Any, raw: bool) -> None:
    for body in payloads("short", 3, seed=11):
        resp = stub.ModelInfer(grpc_request(body, raw=raw))
        status, answer = post_json(infer_url(served), body)
        assert status == 200
        assert resp.model_name == MODEL and resp.id == "r1" and resp.model_version == "1"
        (out,) = resp.outputs
        assert (out.name, out.datatype, list(out.shape)) == ("y", "FP32", [1, WIDTH])
        got = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(1, WIDTH)
        np.testing.assert_allclose(got, reference(body), rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(
            got, np.asarray(answer["outputs"][0]["data"], np.float32).reshape(1, WIDTH)
        )
        assert resp.parameters["tessera_worker"].int64_param in (0, 1)


def _bad_bodies() -> list[tuple[str, dict[str, Any], str]]:
    base = payloads("short", 1, seed=12)[0]
    out = []
    for label, mutate, model in (
        ("wrong shape", lambda b: b["inputs"][0].update(shape=[1, WIDTH // 2, 2]), MODEL),
        ("n out of range", lambda b: b["inputs"][1].update(data=[-4]), MODEL),
        ("wrong datatype", lambda b: b["inputs"][1].update(datatype="INT32"), MODEL),
        ("missing input", lambda b: b["inputs"].pop(1), MODEL),
        ("unknown model", lambda b: None, 'a"b'),
    ):
        b = json.loads(json.dumps(base))
        mutate(b)
        out.append((label, b, model))
    return out


@pytest.mark.parametrize(("label", "body", "model"), _bad_bodies(), ids=[x[0] for x in _bad_bodies()])
def test_errors_are_the_same_over_grpc_and_http(
    served: Stack, stub: Any, label: str, body: dict[str, Any], model: str
) -> None:
    status, err = post_json(infer_url(served, model=model), body)
    with pytest.raises(grpc.RpcError) as rpc:
        stub.ModelInfer(grpc_request(body, raw=True, model=model))
    assert rpc.value.code() == HTTP_TO_GRPC[status], (label, err, rpc.value)
    assert rpc.value.details() == err["error"], label
    trailing = dict(rpc.value.trailing_metadata() or ())
    assert trailing.get("tessera-reason") == err["reason"], label


def test_grpc_and_http_share_the_batching_queue(served: Stack, stub: Any) -> None:
    bodies = payloads("short", 8, seed=13)

    def one(i: int) -> tuple[int, np.ndarray]:
        if i % 2:
            resp = stub.ModelInfer(grpc_request(bodies[i], raw=True))
            return resp.parameters["tessera_batch_size"].int64_param, np.frombuffer(
                resp.raw_output_contents[0], "<f4"
            ).reshape(1, WIDTH)
        _, a = post_json(infer_url(served), bodies[i])
        return a["parameters"]["tessera_batch_size"], np.asarray(a["outputs"][0]["data"], np.float32).reshape(
            1, WIDTH
        )

    with ThreadPoolExecutor(len(bodies)) as pool:
        got = list(pool.map(one, range(len(bodies))))
    for (_, y), body in zip(got, bodies, strict=True):
        np.testing.assert_allclose(y, reference(body), rtol=1e-3, atol=1e-3)
    assert max(size for size, _ in got) > 1  # requests from both fronts joined one batch


def test_tessera_gateway_serves_grpc_with_grpc_port(demo_model: Path, tmp_path: Path) -> None:
    """The command line: `tessera gateway --grpc-port` beside its HTTP port, workers in processes."""
    from .gateway_harness import free_port, gateway_process, worker_process

    port = free_port()
    body = payloads("short", 1, seed=14)[0]
    with (
        worker_process(demo_model) as (worker, _),
        gateway_process(gateway_config([worker]), tmp_path, grpc_port=port),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
        resp = stub.ModelInfer(grpc_request(body, raw=True), timeout=30)
    got = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(1, WIDTH)
    np.testing.assert_allclose(got, reference(body), rtol=1e-3, atol=1e-3)
