"""The gateway ↔ worker batch exchange (raw bodies in, framed members out) and the worker's modelled cost."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from tessera.gateway.batch_wire import (
    MEMBERS_HEADER,
    SOLO_HEADER,
    WorkerFailure,
    batch_request,
    frame_members,
    post_batch,
    read_framed,
)
from tessera.gateway.protocol import dumps, loads, output_tensor

WIDTH = 16


def body(x: list[float], n: int) -> dict[str, Any]:
    return {
        "id": "r",
        "inputs": [
            {"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": x},
            {"name": "n", "shape": [1, 1], "datatype": "INT64", "data": [n]},
        ],
    }


def test_batch_request_splices_raw_bodies_into_valid_json() -> None:
    raws = [dumps(body([0.5] * WIDTH, 3)), dumps(body([1.0] * WIDTH, 7))]
    data, header_length = batch_request(raws, solo=True)
    assert header_length is None
    parsed = json.loads(data)
    assert parsed["solo"] is True
    assert [r["inputs"][1]["data"] for r in parsed["requests"]] == [[3], [7]]
    # Binary tensor bytes follow the JSON, member after member, and the header says where JSON ends.
    data, header_length = batch_request(raws, solo=False, blobs=[b"ab", b"", b"cde"])
    assert header_length is not None and data[header_length:] == b"abcde"
    assert json.loads(data[:header_length])["solo"] is False


def test_framed_members_round_trip_and_inconsistencies_fail_loudly() -> None:
    frags = [(200, b'[{"name":"y"}]', b"\x00\x01"), (400, b'{"error":"bad"}', b""), (200, b"[]", b"")]
    payload, spec = frame_members(frags)
    assert spec == "200:14:2,400:15:0,200:2:0"
    answer = read_framed(payload, {MEMBERS_HEADER: spec, SOLO_HEADER: "0.5,-,0.25"}, 3)
    assert answer.members == frags
    assert answer.solo_seconds == [0.5, None, 0.25]
    with pytest.raises(WorkerFailure, match=r"2 members .* for 3 requests"):
        read_framed(payload[:-2], {MEMBERS_HEADER: "200:14:2,400:15:0"}, 3)
    with pytest.raises(WorkerFailure, match="malformed"):
        read_framed(payload, {MEMBERS_HEADER: "200-14"}, 1)
    with pytest.raises(WorkerFailure, match="no x-tessera-members"):
        read_framed(payload, {}, 3)


def test_output_tensors_are_written_from_numpy_buffers() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)[1:]  # a row slice
    out = loads(dumps([output_tensor("y", arr)]))
    assert out == [{"name": "y", "shape": [1, 3], "datatype": "FP32", "data": [3.0, 4.0, 5.0]}]
    strided = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]  # not contiguous
    assert loads(dumps(output_tensor("z", strided)))["data"] == [0, 2, 4, 6, 8, 10]


def test_modelled_cost_pays_for_the_longest_row_and_stretches_per_row() -> None:
    from tessera.gateway.worker import ModelledCost

    cost = ModelledCost("n", unit_s=0.001, growth=0.2, fixed_s=0.002)
    # 0.002 + 0.001 · 80 · (1 + 0.2 · (2 − 1)) = 0.098
    assert cost.seconds({"n": np.array([[20], [80]])}) == pytest.approx(0.098)
    assert cost.seconds({"n": np.array([[20]])}) == pytest.approx(0.022)
    with pytest.raises(ValueError, match=">= 0"):
        ModelledCost("n", unit_s=-1.0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tessera.gateway.demo_models import early_exit_model

    return early_exit_model(tmp_path_factory.mktemp("m") / "ee.onnx", width=WIDTH)


def test_paced_worker_answers_framed_members_with_the_models_outputs(model_path: Path) -> None:
    from tessera.gateway.demo_models import early_exit_reference
    from tessera.gateway.worker import ModelledCost, OnnxModel, Worker, make_worker_app

    with pytest.raises(ValueError, match="integer input"):
        OnnxModel(model_path, name="ee", cost=ModelledCost("x", 0.001))
    model = OnnxModel(model_path, name="ee", cost=ModelledCost("n", unit_s=0.01))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(WIDTH).astype(np.float32) for _ in range(2)]
    good = [body([float(v) for v in x], n) for x, n in zip(xs, (2, 5), strict=True)]
    bad = {"inputs": [{"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": [0.0] * WIDTH}]}

    async def go() -> tuple[Any, Any, float]:
        server = TestServer(make_worker_app(Worker(model)))
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            async with aiohttp.ClientSession() as s:
                t0 = time.perf_counter()
                batch = await post_batch(
                    s, url, "ee", [dumps(b) for b in [*good, bad]], solo=False, timeout_s=10
                )
                elapsed = time.perf_counter() - t0
                solo = await post_batch(s, url, "ee", [dumps(good[0]), dumps(bad)], solo=True, timeout_s=10)
        finally:
            await server.close()
        return batch, solo, elapsed

    batch, solo, elapsed = asyncio.run(go())
    assert [st for st, _, _ in batch.members] == [200, 200, 400]
    err = loads(batch.members[2][1])
    assert "missing ['n']" in err["error"] and err["reason"] == "bad-request"
    # Two valid rows, the longest n = 5: 10 ms · 5 · (1 + 0·1) = 50 ms at least.
    assert batch.compute_seconds >= 0.05 and elapsed >= 0.05
    for (_, frag, _), x, n in zip(batch.members[:2], xs, (2, 5), strict=True):
        (y,) = loads(frag)
        want = early_exit_reference(x.reshape(1, WIDTH), np.array([[n]]), width=WIDTH)
        np.testing.assert_allclose(np.asarray(y["data"]).reshape(1, WIDTH), want, rtol=1e-5, atol=1e-5)
    assert solo.solo_seconds is not None and solo.solo_seconds[1] is None
    assert solo.solo_seconds[0] is not None and solo.solo_seconds[0] >= 0.02  # n = 2 alone: 20 ms
