"""Fuzzing the scheduler extender's three verbs over real HTTP on loopback (issue 19).

The extender (no API server: bind reads pods from its view and writes nothing) serves on 127.0.0.1 from an
event loop in a background thread; its view holds two nodes and a few pods. Each generated request — raw
bytes, arbitrary JSON, or kube-scheduler's ExtenderArgs / ExtenderBindingArgs with fields, quantities and
annotations drawn wild — must get a 200 or a 4xx with a JSON `Error` reason within a deadline, never a 5xx,
and no log record may carry a traceback. Derandomized, so a failure reproduces; each suite reports its count.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tessera.api import contract
from tessera.extender.server import Extender, make_app

from tests.integration.agent.peer_support import ErrorLog, LoopThread
from tests.integration.extender.conftest import node, pod

CASES = 250
DEADLINE_S = 10.0
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,  # each request has its own socket deadline; the shared machine's pace varies
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
NODES = ["gpu-a", "gpu-b"]
PODS = ["p0", "p1", "p2"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
quantities = st.one_of(
    st.sampled_from(["1", "8k", "16Gi", "1e999", "-1", "0", "0.5", "100", "101", "1Ki", "abc", "", "1e-999"]),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    values,
)
annotation_values = st.one_of(
    st.sampled_from(
        [
            '{"node": "gpu-a", "gpuIndices": [0]}',
            '{"node": "gpu-a", "gpuIndices": [7]}',
            '{"node": 1e999}',
            "training:latency-critical",
            "serving:best-effort",
            "training:urgent",
            "compute",
            "nan",
            "inf",
            "0.5",
            "-1",
        ]
    ),
    st.text(max_size=40),
)


def _sometimes(draw: st.DrawFn, usual: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> Any:
    """Mostly `usual`, one time in eight `wild`: most requests reach the decision code, some break a field."""
    return draw(wild) if draw(st.integers(0, 7)) == 0 else draw(usual)


@st.composite
def extender_args(draw: st.DrawFn) -> Any:
    """ExtenderArgs close enough to kube-scheduler's that most reach the decision code."""
    body = pod(_sometimes(draw, st.sampled_from([*PODS, "new"]), st.text(max_size=10)))
    body["metadata"]["uid"] = _sometimes(draw, st.sampled_from([f"uid-{n}" for n in PODS] + ["u"]), values)
    limits: dict[str, Any] = {}
    for name in (contract.RESOURCE_GPU, contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU_COMPUTE):
        if draw(st.booleans()):
            limits[name] = draw(quantities)
    usual = st.sampled_from(
        [{"limits": limits}, {"requests": limits}, {"limits": limits, "requests": limits}]
    )
    body["spec"]["containers"][0]["resources"] = _sometimes(draw, usual, values)
    body["metadata"]["annotations"] = draw(
        st.dictionaries(
            st.sampled_from([contract.ANN_PLACEMENT, contract.ANN_WORKLOAD, contract.ANN_PROFILE, "x"]),
            st.integers(0, 7).flatmap(lambda k: values if k == 0 else annotation_values),
            max_size=3,
        )
    )
    body = _sometimes(draw, st.just(body), values)  # now and then a Pod that is not a Pod
    names = _sometimes(
        draw, st.lists(st.sampled_from([*NODES, "ghost"]), max_size=4), st.lists(st.text(max_size=8)) | values
    )
    if draw(st.booleans()):
        return {"Pod": body, "NodeNames": names}
    items = names if not isinstance(names, list) else [{"metadata": {"name": n}} for n in names]
    return {"Pod": body, "Nodes": {"items": _sometimes(draw, st.just(items), values)}}


@st.composite
def binding_args(draw: st.DrawFn) -> Any:
    name = _sometimes(draw, st.sampled_from(PODS), st.text(max_size=10) | values)
    return {
        "PodName": name,
        "PodNamespace": _sometimes(draw, st.just("default"), st.text(max_size=10) | values),
        "PodUID": _sometimes(draw, st.sampled_from([f"uid-{name}", "uid-p0", "other"]), values),
        "Node": _sometimes(draw, st.sampled_from([*NODES, "ghost"]), st.text(max_size=8) | values),
    }


def bodies(structured: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Mostly the structured request; sometimes any JSON value or any bytes."""
    as_json = structured.map(lambda v: json.dumps(v, allow_nan=True).encode())
    wild = values.map(lambda v: json.dumps(v, allow_nan=True).encode()) | st.binary(max_size=64)
    return st.integers(0, 7).flatmap(lambda k: wild if k == 0 else as_json)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, Extender]]:
    extender = Extender(None)
    for name in NODES:
        extender.view.apply_node(node(name, gpus=2, memory_mib=16000))
    for name in PODS:
        extender.view.apply_pod(pod(name, memory=4000, compute=25))
    loop = LoopThread()

    async def start() -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(make_app(extender))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    runner, port = loop.run(start())
    yield port, extender
    loop.run(runner.cleanup())
    loop.close()


def _post(port: int, verb: str, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        conn.request("POST", f"/{verb}", body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _check(status: int, reply: Any, verb: str) -> None:
    assert status in (200, 400, 413), (verb, status, reply)
    if status != 200:
        assert isinstance(reply["Error"], str) and reply["Error"], reply
    elif verb == "filter":
        assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    elif verb == "prioritize":
        assert all(0 <= s["Score"] <= 10 for s in reply)
    else:
        assert set(reply) == {"Error"}


@pytest.mark.parametrize(
    ("verb", "structured"),
    [("filter", extender_args()), ("prioritize", extender_args()), ("bind", binding_args())],
)
def test_every_request_gets_a_200_or_a_4xx_with_a_reason(
    server: tuple[int, Extender], verb: str, structured: st.SearchStrategy[Any]
) -> None:
    port, _ = server
    ran: list[int] = []

    @FUZZ
    @given(body=bodies(structured))
    def case(body: bytes) -> None:
        status, reply = _post(port, verb, body)
        _check(status, reply, verb)
        ran.append(1)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"extender /{verb}: {len(ran)} generated cases")
    assert len(ran) >= 200
