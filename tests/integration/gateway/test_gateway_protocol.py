"""The Open Inference Protocol as clients use it, against a real gateway and workers on loopback:
JSON error bodies everywhere, versioned model paths, the binary tensor data extension, readiness that
follows the workers, and failures that stay with the request they belong to (issue 20)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tessera.gateway.demo_models import early_exit_reference

from .gateway_harness import MODEL, WIDTH, model_config, payloads, worker_process
from .inproc import Stack, stack

HEADER_LENGTH = "Inference-Header-Content-Length"


def call(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def post_json(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, _, raw = call(
        "POST", url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    return status, json.loads(raw)


def gateway_config(workers: list[str], **extra: Any) -> dict[str, Any]:
    extra.setdefault("timeout", {"max_queue_delay_s": 0.02})
    cfg = model_config("timeout", workers, {}, 5.0, mean_solo_s=0.005, **extra)
    cfg["health_interval_s"] = 0.1
    return cfg


def reference(body: dict[str, Any]) -> np.ndarray:
    x = np.asarray(body["inputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
    n = np.asarray(body["inputs"][1]["data"], dtype=np.int64).reshape(1, 1)
    return early_exit_reference(x, n, width=WIDTH)


@pytest.fixture(scope="module")
def served(demo_model: Path) -> Iterator[Stack]:
    with stack() as s:
        workers = [s.add_worker(demo_model), s.add_worker(demo_model)]
        s.start_gateway(gateway_config(workers))
        yield s


def infer_url(s: Stack, version: str | None = None, model: str = MODEL) -> str:
    v = f"/versions/{version}" if version is not None else ""
    return f"{s.url}/v2/models/{model}{v}/infer"


def test_every_error_is_a_json_object_with_error_and_reason(served: Stack) -> None:
    cases = [
        ("POST", f"{served.url}/v2/models/a%22b/infer", b"{}", 404, "not-found"),
        ("GET", f"{served.url}/v2/models/a%22b", None, 404, "not-found"),
        ("GET", f"{served.url}/v2/models/{MODEL}/versions/7", None, 404, "not-found"),
        ("GET", f"{served.url}/v2/nowhere", None, 404, "not-found"),
        ("GET", infer_url(served), None, 405, "method-not-allowed"),
        ("POST", infer_url(served), b"{not json", 400, "bad-request"),
        ("POST", infer_url(served), b'{"inputs": []}', 400, "bad-request"),
    ]
    for method, url, body, status, reason in cases:
        got, headers, raw = call(method, url, body)
        assert got == status, (url, raw)
        assert headers["Content-Type"].startswith("application/json"), (url, headers)
        err = json.loads(raw)  # valid JSON even for a model named a"b
        assert set(err) >= {"error", "reason"} and err["reason"] == reason, (url, err)
    got, _, raw = call("GET", f"{served.url}/v2/models/a%22b")
    assert 'a"b' in json.loads(raw)["error"]


def test_a_body_over_the_limit_gets_a_json_413(served: Stack) -> None:
    big = b" " * (64 * 1024 * 1024 + 1)
    status, _, raw = call("POST", infer_url(served), big, {"Content-Type": "application/json"})
    assert status == 413
    assert json.loads(raw)["reason"] == "too-large"


def test_versioned_paths_serve_version_1_like_the_plain_ones(served: Stack) -> None:
    base = f"{served.url}/v2/models/{MODEL}"
    for suffix in ("", "/ready"):
        plain = call("GET", base + suffix)
        versioned = call("GET", f"{base}/versions/1{suffix}")
        assert plain[0] == versioned[0] == 200
        assert json.loads(plain[2]) == json.loads(versioned[2])
    body = payloads("short", 1, seed=3)[0]
    status, answer = post_json(infer_url(served, "1"), body)
    assert status == 200 and answer["model_name"] == MODEL and answer["model_version"] == "1"
    np.testing.assert_allclose(
        np.asarray(answer["outputs"][0]["data"]).reshape(1, WIDTH), reference(body), rtol=1e-3, atol=1e-3
    )
    status, err = post_json(infer_url(served, "2"), body)
    assert status == 404 and err["reason"] == "not-found" and "version" in err["error"]


def binary_request(body: dict[str, Any], *, binary_out: bool) -> tuple[bytes, dict[str, str]]:
    """``body`` in the binary tensor data extension: raw little-endian inputs after the JSON header."""
    x = np.asarray(body["inputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
    n = np.asarray(body["inputs"][1]["data"], dtype=np.int64).reshape(1, 1)
    head = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, WIDTH],
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            },
            {"name": "n", "shape": [1, 1], "datatype": "INT64", "parameters": {"binary_data_size": n.nbytes}},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": binary_out}}],
    }
    raw = json.dumps(head).encode()
    return raw + x.astype("<f4").tobytes() + n.astype("<i8").tobytes(), {HEADER_LENGTH: str(len(raw))}


def test_binary_tensor_data_in_and_out(served: Stack) -> None:
    body = payloads("short", 1, seed=4)[0]
    want = reference(body)
    data, headers = binary_request(body, binary_out=True)
    status, h, raw = call("POST", infer_url(served), data, headers)
    assert status == 200, raw
    n = int(h[HEADER_LENGTH])
    answer = json.loads(raw[:n])
    (y,) = answer["outputs"]
    assert y["name"] == "y" and y["shape"] == [1, WIDTH] and "data" not in y
    assert y["parameters"]["binary_data_size"] == len(raw) - n == 4 * WIDTH
    np.testing.assert_allclose(np.frombuffer(raw[n:], "<f4").reshape(1, WIDTH), want, rtol=1e-3, atol=1e-3)
    # Binary in, JSON out.
    data, headers = binary_request(body, binary_out=False)
    status, h, raw = call("POST", infer_url(served), data, headers)
    assert status == 200 and HEADER_LENGTH not in h
    np.testing.assert_allclose(
        np.asarray(json.loads(raw)["outputs"][0]["data"]).reshape(1, WIDTH), want, rtol=1e-3, atol=1e-3
    )
    # JSON in, binary out for every output (request-level binary_data_output).
    status, h, raw = call(
        "POST", infer_url(served), json.dumps({**body, "parameters": {"binary_data_output": True}}).encode()
    )
    assert status == 200
    n = int(h[HEADER_LENGTH])
    np.testing.assert_allclose(np.frombuffer(raw[n:], "<f4").reshape(1, WIDTH), want, rtol=1e-3, atol=1e-3)


def test_binary_sizes_that_do_not_add_up_are_a_400(served: Stack) -> None:
    data, headers = binary_request(payloads("short", 1, seed=4)[0], binary_out=True)
    status, _, raw = call("POST", infer_url(served), data[:-3], headers)
    assert status == 400 and "binary_data_size" in json.loads(raw)["error"]
    status, _, raw = call("POST", infer_url(served), data, {HEADER_LENGTH: str(len(data) + 5)})
    assert status == 400 and json.loads(raw)["reason"] == "bad-request"


def metric(url: str, outcome: str) -> float:
    text = call("GET", f"{url}/metrics")[2].decode()
    m = re.search(rf'tessera_serving_requests_total\{{[^}}]*outcome="{outcome}"[^}}]*\}} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


def test_a_models_400_goes_to_its_caller_only_and_is_not_a_drop(served: Stack) -> None:
    good = payloads("short", 6, seed=6)
    bad = json.loads(json.dumps(good[0]))
    bad["inputs"][0]["shape"] = [1, WIDTH // 2, 2]  # same element count, wrong shape for the model
    dropped, rejected = metric(served.url, "dropped"), metric(served.url, "rejected")
    bodies = [*good[:3], bad, *good[3:]]
    with ThreadPoolExecutor(len(bodies)) as pool:  # sent together, so they share batches
        answers = list(pool.map(lambda b: post_json(infer_url(served), b), bodies))
    status, err = answers[3]
    assert status == 400 and err["reason"] == "bad-request" and "shape" in err["error"], err
    for (status, answer), body in zip(answers[:3] + answers[4:], good, strict=True):
        assert status == 200, answer
        np.testing.assert_allclose(
            np.asarray(answer["outputs"][0]["data"]).reshape(1, WIDTH), reference(body), rtol=1e-3, atol=1e-3
        )
    assert max(a["parameters"]["tessera_batch_size"] for s, a in answers if s == 200) > 1
    assert metric(served.url, "rejected") == rejected + 1
    assert metric(served.url, "dropped") == dropped
    assert call("GET", f"{served.url}/v2/health/ready")[0] == 200  # no worker was blamed


def test_a_batch_over_the_workers_body_limit_is_split_not_failed(demo_model: Path) -> None:
    bodies = payloads("short", 8, seed=8)
    one = len(json.dumps(bodies[0]))
    with stack() as s:
        # The worker takes bodies of about three requests: a joined batch of eight gets a 413.
        worker = s.add_worker(demo_model, max_body=3 * one + 200)
        s.start_gateway(gateway_config([worker], max_batch=8, timeout={"max_queue_delay_s": 0.1}))
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda b: post_json(infer_url(s), b), bodies))
        too_big = {
            "inputs": [
                {**bodies[0]["inputs"][0], "data": bodies[0]["inputs"][0]["data"] * 4, "shape": [4, WIDTH]},
                {**bodies[0]["inputs"][1], "data": [3] * 4, "shape": [4, 1]},
            ]
        }
        alone = post_json(infer_url(s), too_big)
        ready = call("GET", f"{s.url}/v2/health/ready")[0]
    for (status, answer), body in zip(answers, bodies, strict=True):
        assert status == 200, answer
        np.testing.assert_allclose(
            np.asarray(answer["outputs"][0]["data"]).reshape(1, WIDTH), reference(body), rtol=1e-3, atol=1e-3
        )
    assert max(a["parameters"]["tessera_batch_size"] for _, a in answers) > 3  # one batch, sent in parts
    # A request the worker cannot take even alone gets the 413 itself; the worker stays in service.
    assert alone[0] == 413 and alone[1]["reason"] == "too-large", alone
    assert ready == 200


def wait_for(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {timeout}s")


def test_readiness_follows_the_workers(demo_model: Path) -> None:
    with worker_process(demo_model) as (a, pa), worker_process(demo_model) as (b, pb), stack() as s:
        s.start_gateway(gateway_config([a, b]))
        ready = f"{s.url}/v2/health/ready"
        model_ready = f"{s.url}/v2/models/{MODEL}/ready"
        wait_for(lambda: call("GET", ready)[0] == 200, 30, "ready with both workers")
        pa.kill()
        pa.wait(10)
        assert s.gateway is not None
        first = s.gateway.services[MODEL].slots[0]
        wait_for(lambda: not first.healthy, 10, "the killed worker taken out")
        assert call("GET", ready)[0] == 200  # the model stays ready on the other worker
        pb.kill()
        pb.wait(10)
        took = wait_for(lambda: call("GET", ready)[0] == 503, 10, "not ready after every worker was killed")
        status, _, raw = call("GET", model_ready)
        assert status == 503 and json.loads(raw)["ready"] is False
    assert took < 10


def test_a_worker_crash_mid_batch_retries_once_on_another_worker(demo_model: Path) -> None:
    from .gateway_harness import PACE

    with (
        worker_process(demo_model, pace=PACE) as (a, victim),
        worker_process(demo_model, pace=PACE) as (b, _),
        stack() as s,
    ):
        s.start_gateway(gateway_config([a, b], timeout={"max_queue_delay_s": 0.0}))
        wait_for(lambda: call("GET", f"{s.url}/v2/health/ready")[0] == 200, 30, "gateway ready")
        body = payloads("long", 1, seed=9)[0]
        body["inputs"][1]["data"] = [1500]  # 1.5 s on a paced worker: long enough to kill it mid-run
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(post_json, infer_url(s), body, {"x-tessera-deadline-ms": "60000"})
            assert s.gateway is not None
            svc = s.gateway.services[MODEL]
            wait_for(lambda: svc.slots[0].busy, 20, "the batch running on the first worker")
            victim.kill()
            status, answer = fut.result(60)
        direct = post_json(f"{b}/v2/models/{MODEL}/infer", body)[1]
    assert status == 200, answer
    assert answer["parameters"]["tessera_retries"] == 1 and answer["parameters"]["tessera_worker"] == 1
    # 1500 tanh layers amplify float rounding, so compare with the surviving worker's own answer.
    assert answer["outputs"] == direct["outputs"]


def test_the_demo_model_refuses_inputs_out_of_its_declared_shape_and_range(served: Stack) -> None:
    body = payloads("short", 1, seed=10)[0]
    for mutate, words in (
        (lambda b: b["inputs"][0].update(shape=[1, WIDTH // 2, 2]), "shape"),
        (lambda b: b["inputs"][1].update(shape=[1], data=[3]), "shape"),
        (lambda b: b["inputs"][1].update(data=[-1]), "[0, 10000]"),
        (lambda b: b["inputs"][1].update(data=[10**9]), "[0, 10000]"),
        (lambda b: b["inputs"][1].update(datatype="INT32"), "INT64"),
    ):
        bad = json.loads(json.dumps(body))
        mutate(bad)
        status, err = post_json(infer_url(served), bad)
        assert status == 400 and err["reason"] == "bad-request" and words in err["error"], err
