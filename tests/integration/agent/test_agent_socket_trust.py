"""Issue 19, "node sockets trust anyone": the progress and lane coordinator sockets act only for the caller's pod.

Every client here is a separate process on a real unix socket; the agent maps it to a pod through its peer
credentials and a fake /proc tree holding the cgroup paths kubelet would give it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tessera.api import contract
from tessera_agent.kubelet.allocate import progress_endpoint
from tessera_agent.lanes.coordinator import LaneCoordinator
from tessera_agent.lanes.peers import PeerResolver
from tessera_agent.lanes.progress import ProgressServer
from tessera_agent.pods import StaticPodSource

from .peer_support import NODE, FakeProc, Peer, lane_pod, pod_uid

TRAIN, VICTIM, MATE = pod_uid(1), pod_uid(2), pod_uid(3)


@pytest.fixture
def source() -> StaticPodSource:
    return StaticPodSource(
        [
            lane_pod("ml", "train", 1, "lane-1"),
            lane_pod("other", "victim", 2, "lane-2"),
            lane_pod("other", "mate", 3, "lane-2"),  # shares the victim's lane
        ]
    )


@pytest.fixture
def fake(plugin_dir: Path) -> FakeProc:
    return FakeProc(plugin_dir / "proc")


@pytest.fixture
async def progress(
    plugin_dir: Path, source: StaticPodSource, fake: FakeProc
) -> AsyncIterator[ProgressServer]:
    server = ProgressServer(
        NODE,
        source,
        socket_path=plugin_dir / "progress.sock",
        peers=PeerResolver(NODE, source, proc_root=fake.root),
        socket_group=os.getgid(),
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def coordinator(
    plugin_dir: Path, source: StaticPodSource, fake: FakeProc
) -> AsyncIterator[LaneCoordinator]:
    c = LaneCoordinator(
        plugin_dir / "coord.sock",
        peers=PeerResolver(NODE, source, proc_root=fake.root),
        socket_group=os.getgid(),
    )
    await c.start()
    yield c
    await c.stop()


@pytest.fixture
async def peers() -> AsyncIterator[list[Peer]]:
    started: list[Peer] = []
    yield started
    for p in started:
        await p.close()


async def spawn(peers: list[Peer], fake: FakeProc | None, uid: str | None, **kw: object) -> Peer:
    p = await Peer.start(fake, uid, **kw)  # type: ignore[arg-type]
    peers.append(p)
    return p


def url(server: ProgressServer, ns: str, name: str) -> str:
    return progress_endpoint(str(server.socket_path), ns, name)


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not bad, bad


@pytest.mark.parametrize("which", ["progress", "coordinator"])
async def test_sockets_are_group_only(
    which: str, progress: ProgressServer, coordinator: LaneCoordinator, fake: FakeProc, peers: list[Peer]
) -> None:
    path = progress.socket_path if which == "progress" else coordinator.socket_path
    assert path is not None
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    if os.geteuid() == 0:  # finding: a process as uid 65534 reached both sockets
        nobody = await spawn(peers, fake, None, user=65534)
        assert (await nobody.ask(f"connect {path}"))["oserror"] == errno.EACCES


async def test_progress_for_another_pod_is_refused(
    progress: ProgressServer,
    source: StaticPodSource,
    fake: FakeProc,
    peers: list[Peer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    intruder = await spawn(peers, fake, TRAIN)  # a workload in namespace ml
    host = await spawn(peers, fake, None)  # a process outside any pod
    for p, who in [(intruder, "pod ml/train"), (host, "not in a pod")]:
        reply = await p.ask(f"progress {url(progress, 'other', 'victim')} 99 100")
        assert not reply["ok"] and "(403)" in reply["error"] and who in reply["error"], reply
    assert VICTIM not in source.annotations  # the victim's tessera.io/progress was not written
    assert any("refused" in r.getMessage() for r in caplog.records)

    victim = await spawn(peers, fake, VICTIM)
    assert (await victim.ask(f"progress {url(progress, 'other', 'victim')} 3 100"))["ok"]
    train_v1 = await spawn(peers, fake, TRAIN, form="cgroupfs")  # cgroup v1 paths, cgroupfs driver
    assert (await train_v1.ask(f"progress {url(progress, 'ml', 'train')} 5 10"))["ok"]
    assert '"iterations":3' in source.annotations[VICTIM][contract.ANN_PROGRESS]
    assert '"iterations":5' in source.annotations[TRAIN][contract.ANN_PROGRESS]
    no_tracebacks(caplog)


async def test_a_lane_is_joined_only_by_the_pods_assigned_to_it(
    coordinator: LaneCoordinator, fake: FakeProc, peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    sock = coordinator.socket_path
    intruder = await spawn(peers, fake, TRAIN)
    assert (await intruder.ask(f"connect {sock}"))["connected"]
    # finding: any process could join the victim's lane under the victim's job name and hold it
    reply = await intruder.send({"op": "join", "lane": "lane-2", "job": "trainer"})
    assert not reply["ok"] and "lane-1" in reply["error"], reply
    assert not (await intruder.send({"op": "begin"}))["ok"]
    via_sdk = await intruder.ask(f"lane {sock} lane-2 trainer")  # the SDK client says why, then closes
    assert not via_sdk["ok"] and "refused 'join'" in via_sdk["error"] and "lane-1" in via_sdk["error"]
    host = await spawn(peers, fake, None)
    assert (await host.ask(f"connect {sock}"))["connected"]
    assert "not in a pod" in (await host.send({"op": "join", "lane": "lane-2", "job": "trainer"}))["error"]

    # a pod that shares the lane may join it, but its job names cannot squat the victim's
    mate = await spawn(peers, fake, MATE)
    assert (await mate.ask(f"connect {sock}"))["connected"]
    assert (await mate.send({"op": "join", "lane": "lane-2", "job": "trainer"}))["ok"]

    victim = await spawn(peers, fake, VICTIM)
    assert await victim.ask(f"lane {sock} lane-2 trainer") == {"ok": True, "policy": "FAIR"}
    assert (await intruder.send({"op": "join", "lane": "lane-1", "job": "own"}))["ok"]  # its own lane: fine
    no_tracebacks(caplog)


async def test_malformed_coordinator_messages_get_error_replies(
    coordinator: LaneCoordinator, fake: FakeProc, peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    p = await spawn(peers, fake, VICTIM)
    assert (await p.ask(f"connect {coordinator.socket_path}"))["connected"]
    before_join: list[bytes | dict[str, object]] = [
        b"not json\n",
        b"\xff\xfe\x00\n",
        b"[1, 2]\n",
        b"\n",
        {"op": "fly"},
        {"op": "begin"},
        {"op": "join", "lane": "lane-2"},
        {"op": "join", "lane": "lane-2", "job": "j", "memory_mib": "abc"},
        {"op": "join", "lane": "lane-2", "job": "j", "remaining_seconds": float("nan")},
    ]
    after_join: list[bytes | dict[str, object]] = [
        {"op": "progress", "iterations": "x"},  # finding: this closed the connection with a traceback
        {"op": "progress", "iterations": -1},
        {"op": "progress", "iterations": 5, "total": 2},
        {"op": "end"},
        {"op": "join", "lane": "lane-2", "job": "again"},
    ]
    for payload in before_join:
        reply = await p.send(payload)
        assert reply["ok"] is False and reply["error"], (payload, reply)
    assert (await p.send({"op": "join", "lane": "lane-2", "job": "j"}))["ok"]
    for payload in after_join:
        reply = await p.send(payload)
        assert reply["ok"] is False and reply["error"], (payload, reply)
    assert (await p.send({"op": "progress", "iterations": 2, "total": 4}))["ok"]
    assert coordinator.progress("lane-2") == {"other/victim/j": (2, 4)}
    # a line past the size limit: an error, then the connection closes (the stream cannot be resynchronised)
    reply = await p.send(b'{"op": "progress", "pad": "' + b"x" * 100_000 + b'"}\n')
    assert reply["ok"] is False and "too long" in reply["error"], reply
    no_tracebacks(caplog)
    # the coordinator still serves everyone else
    other = await spawn(peers, fake, MATE)
    assert (await other.ask(f"lane {coordinator.socket_path} lane-2 m"))["ok"]
