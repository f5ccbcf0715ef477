"""Issue 19, graceful shutdown: SIGTERM mid-request stops the agent process cleanly and quickly.

A real `tessera-agent` with fake GPUs, the fake MPS binary and a fake kubelet serves both node sockets with the
peer check on (fake pods, fake /proc tree). One job holds a lane, a second waits in `begin`, a kubelet-style
ListAndWatch stream is open; SIGTERM then must answer the waiting request, end the stream, remove the
sockets and exit 0 within the bound.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import grpc
from tessera_agent.proto import api_pb2, api_pb2_grpc

from .agent_fake_kubelet import FakeKubelet
from .peer_support import NODE, FakeProc, Peer, lane_pod

FAKE_MPS = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")


def manifests() -> list[dict[str, object]]:
    out = []
    for ns, name, n in [("other", "victim", 2), ("other", "mate", 3)]:
        pod = lane_pod(ns, name, n, "lane-2")
        assert pod.assignment is not None
        out.append(
            {
                "metadata": {
                    "namespace": ns,
                    "name": name,
                    "uid": pod.uid,
                    "annotations": {"tessera.io/assignment": pod.assignment.to_annotation()},
                }
            }
        )
    return out


async def test_sigterm_mid_request_answers_closes_and_exits_zero(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    fake = FakeProc(plugin_dir / "proc")
    (plugin_dir / "pods.json").write_text(json.dumps(manifests()))
    coord, progress = plugin_dir / "coord.sock", plugin_dir / "progress.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        *("--node", NODE, "--fake-gpus", "1", "--fake-pods", str(plugin_dir / "pods.json")),
        *("--device-plugin-dir", str(plugin_dir), "--mps-root", str(plugin_dir / "mps")),
        *("--mps-binary", FAKE_MPS, "--metrics-port", "0", "--proc-root", str(fake.root)),
        *("--coordinator-socket", str(coord), "--progress-socket", str(progress)),
        *("--shutdown-timeout", "5", "-vv"),
        stderr=asyncio.subprocess.PIPE,
    )
    log: list[str] = []
    waiting = asyncio.Event()

    async def read_log() -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            log.append(line.decode(errors="replace"))
            if "waits for lane lane-2" in log[-1]:
                waiting.set()

    reader = asyncio.create_task(read_log())
    peers: list[Peer] = []
    try:
        await asyncio.wait_for(kubelet.registered.wait(), 30)
        deadline = time.monotonic() + 30
        while not (coord.exists() and progress.exists()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        holder, waiter = await Peer.start(fake, manifests()[0]["metadata"]["uid"]), None  # type: ignore[index]
        peers.append(holder)
        waiter = await Peer.start(fake, manifests()[1]["metadata"]["uid"])  # type: ignore[index]
        peers.append(waiter)
        for p, job in [(holder, "a"), (waiter, "b")]:
            assert (await p.ask(f"connect {coord}"))["connected"]
            assert (await p.send({"op": "join", "lane": "lane-2", "job": job}))["ok"]
        assert (await holder.send({"op": "begin"}))["ok"]  # holds the lane
        pending = asyncio.create_task(waiter.send({"op": "begin"}))
        await asyncio.wait_for(waiting.wait(), 30)  # the agent has the second begin in hand

        async with kubelet.plugin_channel() as ch:
            stream = api_pb2_grpc.DevicePluginStub(ch).ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), 30)
            assert len(first.devices) > 0
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            reply = await asyncio.wait_for(pending, 30)
            assert reply == {"ok": False, "error": "the lane coordinator is shutting down"}, reply
            try:  # the watch ends (the server went away) rather than hanging
                end = await asyncio.wait_for(stream.read(), 30)
                assert end is grpc.aio.EOF
            except grpc.aio.AioRpcError:
                pass
        rc = await asyncio.wait_for(proc.wait(), 30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.wait_for(reader, 30)
        for p in peers:
            await p.close()
    assert rc == 0, "".join(log[-20:])
    assert elapsed < 8, f"shutdown took {elapsed:.1f}s"
    assert not coord.exists() and not progress.exists() and not (plugin_dir / "tessera-gpu.sock").exists()
    assert not any("Traceback" in line for line in log), "".join(log)
