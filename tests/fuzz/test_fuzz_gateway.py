"""Fuzzing the serving gateway's Open Inference Protocol endpoints over real HTTP on loopback (issue 19).

A real worker (the early-exit demo ONNX model) and a real gateway run from one event loop in a background
thread. Each generated request — a v2 inference request with fields, shapes, datatypes, data, the binary
extension's header length and the deadline header drawn wild, or any bytes; and GETs of model paths — must
get a 2xx or 4xx with a JSON reason within a deadline. 503/504 are the gateway's documented answers to load
(a request its scheduler dropped, or one past its deadline), never to bad input, and carry a drop reason;
500 never. No log record may carry a traceback. Derandomized; each suite reports how many cases ran.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tessera.api.contract import HEADER_DEADLINE_MS
from tessera.gateway.config import GatewayConfig
from tessera.gateway.demo_models import early_exit_model
from tessera.gateway.protocol import HEADER_LENGTH
from tessera.gateway.server import Gateway, make_gateway_app
from tessera.gateway.worker import OnnxModel, Worker, make_worker_app

from tests.integration.agent.peer_support import ErrorLog, LoopThread

CASES = 250
DEADLINE_S = 15.0
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,  # each request has its own socket deadline; the shared machine's pace varies
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
MODEL = "early-exit"
WIDTH = 4

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _sometimes(
    draw: st.DrawFn, usual: st.SearchStrategy[Any], wild: st.SearchStrategy[Any], odds: int = 16
) -> Any:
    """Mostly `usual`, one time in `odds` `wild`: many requests reach the worker, some break one field."""
    return draw(wild) if draw(st.integers(0, odds - 1)) == 0 else draw(usual)


@st.composite
def tensors(draw: st.DrawFn, name: str, datatype: str, width: int, rows: int) -> Any:
    rows = _sometimes(draw, st.just(rows), st.integers(-2, 10_000))
    shape = _sometimes(draw, st.just([rows, width]), st.lists(st.integers(-3, 2**40), max_size=4) | values)
    count = rows * width if rows > 0 else 0
    number = st.floats(-10, 10, width=32) if datatype == "FP32" else st.integers(0, 30)
    usual = st.lists(number, min_size=count, max_size=count) if count <= 64 else st.just([0] * min(count, 64))
    tensor: dict[str, Any] = {
        "name": _sometimes(draw, st.just(name), st.text(max_size=6) | values),
        "shape": shape,
        "datatype": _sometimes(
            draw, st.just(datatype), st.sampled_from(["FP64", "INT8", "BYTES", "BOOL", "x"]) | values
        ),
        "data": _sometimes(draw, usual, st.lists(scalars, max_size=8) | values),
    }
    if draw(st.integers(0, 15)) == 0:
        tensor["parameters"] = draw(values)
    return tensor


@st.composite
def infer_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of POST /v2/models/<model>/infer."""
    headers = {"Content-Type": "application/json"}
    if draw(st.integers(0, 7)) == 0:
        headers[HEADER_DEADLINE_MS] = draw(
            st.sampled_from(["60000", "0", "-5", "nan", "inf", "1e999", "abc", ""])
            | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8)
        )
    if draw(st.integers(0, 15)) == 0:
        return draw(st.binary(max_size=64)), headers
    rows = draw(st.integers(1, 3))
    inputs = [draw(tensors("x", "FP32", WIDTH, rows)), draw(tensors("n", "INT64", 1, rows))]
    body: dict[str, Any] = {"inputs": _sometimes(draw, st.just(inputs), values)}
    if draw(st.booleans()):
        body["id"] = _sometimes(draw, st.text(max_size=8), values)
    if draw(st.integers(0, 7)) == 0:
        body["outputs"] = _sometimes(draw, st.just([{"name": "y"}]), values, 2)
    if draw(st.integers(0, 7)) == 0:
        body["parameters"] = draw(values)
    raw = json.dumps(_sometimes(draw, st.just(body), values), allow_nan=True).encode()
    if draw(st.integers(0, 15)) == 0:  # the binary data extension: a header length, right or wrong
        raw += draw(st.binary(max_size=16))
        headers[HEADER_LENGTH] = draw(st.sampled_from([str(len(raw)), "0", "-1", "x", str(2**70)]))
    return raw, headers


@pytest.fixture(scope="module")
def gateway_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    model = early_exit_model(
        tmp_path_factory.mktemp("fuzz-model") / "early_exit.onnx", width=WIDTH, max_layers=30
    )
    loop = LoopThread()

    async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    worker, worker_port = loop.run(serve(make_worker_app(Worker(OnnxModel(model, name=MODEL)))))
    config = GatewayConfig.model_validate(
        {
            "models": [
                {
                    "name": MODEL,
                    "policy": "timeout",
                    "slo_s": 60.0,
                    "workers": [f"http://127.0.0.1:{worker_port}"],
                    "mean_solo_s": 0.01,
                }
            ],
            "health_interval_s": 0.2,
        }
    )
    gateway, port = loop.run(serve(make_gateway_app(Gateway(config))))
    yield port
    loop.run(gateway.cleanup())
    loop.run(worker.cleanup())
    loop.close()


def _request(
    port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        conn.request(method, path, body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _check_answer(status: int, raw: bytes) -> None:
    assert status < 500 or status in (503, 504), (status, raw[:300])
    if status == 200:
        return
    reply = json.loads(raw)
    assert isinstance(reply.get("error"), str) and reply["error"], reply
    if status >= 500:  # load, not input: a drop reason, never an internal error
        assert reply.get("reason") not in (None, "internal"), reply


def test_infer_answers_every_request_with_a_status_and_a_reason(gateway_port: int) -> None:
    ran: list[int] = []

    @FUZZ
    @given(request=infer_requests())
    def case(request: tuple[bytes, dict[str, str]]) -> None:
        body, headers = request
        status, raw = _request(gateway_port, "POST", f"/v2/models/{MODEL}/infer", body, headers)
        _check_answer(status, raw)
        if status == 200:
            assert json.loads(raw)["outputs"]
        ran.append(1)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"gateway infer: {len(ran)} generated cases")
    assert len(ran) >= 200


def test_model_paths_answer_with_a_status_and_a_reason(gateway_port: int) -> None:
    ran: list[int] = []
    names = st.just(MODEL) | st.text(min_size=1, max_size=12)
    tails = st.sampled_from(
        ["", "/ready", "/infer", "/versions/1", "/versions/1/ready", "/versions//infer",
         # Triton's configuration and statistics extensions
         "/config", "/stats", "/versions/1/config", "/versions/2/stats"]
    )  # fmt: skip

    @FUZZ
    @given(
        method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
        name=names,
        tail=tails,
        body=st.binary(max_size=32),
    )
    def case(method: str, name: str, tail: str, body: bytes) -> None:
        path = f"/v2/models/{quote(name, safe='')}{tail}"
        status, raw = _request(gateway_port, method, path, body if method != "GET" else None, {})
        _check_answer(status, raw)
        ran.append(1)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"gateway model paths: {len(ran)} generated cases")
    assert len(ran) >= 200


def test_repository_requests_answer_with_a_status_and_a_reason(gateway_port: int) -> None:
    """Triton's repository extension: the index with any body, load and unload of any name."""
    ran: list[int] = []

    @FUZZ
    @given(
        path=st.sampled_from(
            ["/v2/repository/index", "/v2/repository/models/{}/load", "/v2/repository/models/{}/unload"]
        ),
        name=st.just(MODEL) | st.text(min_size=1, max_size=12),
        body=st.binary(max_size=32) | st.sampled_from([b'{"ready": true}', b"{}", b"[]", b'{"ready": 1}']),
    )
    def case(path: str, name: str, body: bytes) -> None:
        status, raw = _request(gateway_port, "POST", path.format(quote(name, safe="")), body, {})
        _check_answer(status, raw)
        ran.append(1)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"gateway repository requests: {len(ran)} generated cases")
    assert len(ran) >= 200
