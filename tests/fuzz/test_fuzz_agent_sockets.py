"""Fuzzing the node agent's sockets (issue 19): the progress endpoint and the lane coordinator.

Both servers run with the peer check on, over real unix sockets, the test process placed in a pod by a fake
/proc tree. Every generated input must get a well-formed answer (HTTP 2xx/4xx with a JSON reason; a
coordinator reply line with `ok` and an `error` when refused) within a deadline, and no server log may carry
a traceback. Hypothesis runs derandomized, so a failure reproduces; each suite reports how many cases ran.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tessera.sdk import _UnixHTTPConnection
from tessera_agent.lanes.coordinator import MAX_LINE_BYTES, LaneCoordinator
from tessera_agent.lanes.peers import PeerResolver
from tessera_agent.lanes.progress import ProgressServer
from tessera_agent.pods import StaticPodSource

from tests.integration.agent.peer_support import NODE, ErrorLog, FakeProc, LoopThread, lane_pod, pod_uid

CASES = 250
DEADLINE_S = 5.0
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,  # each case has its own socket deadline; the machine is shared and its pace varies
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
)


def _json(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[LoopThread, ProgressServer, LaneCoordinator]]:
    d = Path(tempfile.mkdtemp(prefix="tsf-", dir="/tmp"))
    fake = FakeProc(d / "proc")
    fake.place(os.getpid(), pod_uid(2))  # this process is pod other/victim, lane lane-2
    source = StaticPodSource([lane_pod("ml", "train", 1, "lane-1"), lane_pod("other", "victim", 2, "lane-2")])
    peers = PeerResolver(NODE, source, proc_root=fake.root)
    loop = LoopThread()
    progress = ProgressServer(NODE, source, socket_path=d / "p.sock", peers=peers, socket_group=os.getgid())
    coord = LaneCoordinator(d / "c.sock", peers=peers, socket_group=os.getgid())
    loop.run(progress.start())
    loop.run(coord.start())
    yield loop, progress, coord
    loop.run(coord.stop())
    loop.run(progress.stop())
    loop.close()
    shutil.rmtree(d, ignore_errors=True)


# --- progress endpoint -------------------------------------------------------------------------------------

report_fields = st.dictionaries(
    st.sampled_from(["iterations", "total", "loss", "ts", "extra"]) | st.text(max_size=6), values, max_size=5
)
bodies = st.one_of(
    report_fields.map(_json),
    st.builds(
        lambda i, t: _json({"iterations": i, "total": t}),
        st.integers(-5, 2**60),
        st.none() | st.integers(-5, 2**60),
    ),
    values.map(_json),
    st.binary(max_size=200),
    st.just(b"x" * 10_000),  # over the body limit
)
names = st.sampled_from(["victim", "train", "ghost"]) | st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="/?#%"), min_size=1, max_size=12
)


def test_fuzz_progress_endpoint(world: tuple[LoopThread, ProgressServer, LaneCoordinator]) -> None:
    _, progress, _ = world
    ran: list[int] = []

    @FUZZ
    @given(ns=st.sampled_from(["other", "ml"]) | names, name=names, body=bodies)
    def case(ns: str, name: str, body: bytes) -> None:
        conn = _UnixHTTPConnection(str(progress.socket_path), DEADLINE_S)
        try:
            path = f"/v1/namespaces/{quote(ns, safe='')}/pods/{quote(name, safe='')}/progress"
            conn.request("POST", path, body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        assert resp.status in (200, 400, 403, 404, 413), (resp.status, raw[:200])
        reply = json.loads(raw)
        assert reply["ok"] is (resp.status == 200)
        if resp.status == 200:
            assert (ns, name) == ("other", "victim")  # only the caller's own pod is ever written
        else:
            assert isinstance(reply["error"], str) and reply["error"]
        ran.append(1)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"progress endpoint: {len(ran)} generated cases")
    assert len(ran) >= 200


# --- lane coordinator --------------------------------------------------------------------------------------

ops = st.sampled_from(["join", "begin", "end", "progress"]) | st.text(max_size=6) | values
requests = st.one_of(
    st.fixed_dictionaries(
        {"op": ops},
        optional={
            "lane": st.sampled_from(["lane-2", "lane-1"]) | values,
            "job": st.sampled_from(["j", "k"]) | values,
            "remaining_seconds": values,
            "memory_mib": values,
            "priority": values,
            "next": values,
            "iterations": st.integers(-3, 2**60) | values,
            "total": values,
        },
    ).map(lambda d: _json(d) + b"\n"),
    st.binary(max_size=100).map(lambda b: b.replace(b"\n", b"") + b"\n"),
    values.map(lambda v: _json(v) + b"\n"),
)
sessions = st.lists(requests, min_size=1, max_size=8).flatmap(
    lambda reqs: st.sampled_from([reqs, [*reqs, b'{"op": "join", "x": "' + b"y" * MAX_LINE_BYTES + b'"}\n']])
)


def test_fuzz_lane_coordinator(world: tuple[LoopThread, ProgressServer, LaneCoordinator]) -> None:
    _, _, coord = world
    ran: list[int] = []

    @FUZZ
    @given(lines=sessions)
    def case(lines: list[bytes]) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(DEADLINE_S)
            s.connect(str(coord.socket_path))
            replies = s.makefile("rb")
            for i, line in enumerate(lines):
                s.sendall(line)
                answer = replies.readline()  # a timeout here is a hang: the case fails
                assert answer, f"connection closed after {line[:80]!r}"
                reply = json.loads(answer)
                assert reply["ok"] in (True, False), reply
                if not reply["ok"]:
                    assert isinstance(reply["error"], str) and reply["error"]
                if len(line) > MAX_LINE_BYTES:
                    assert not reply["ok"] and i == len(lines) - 1
                    assert replies.readline() == b""  # then closed cleanly
        ran.append(1)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"lane coordinator: {len(ran)} generated cases")
    assert len(ran) >= 200
