"""Real separate processes on the agent's node sockets, placed in pods through a fake /proc tree.

`Peer` drives `socket_peer.py` in its own process; `FakeProc` writes `<root>/<pid>/cgroup` the way kubelet's
cgroup drivers name a pod, so the agent (pointed at the fake root) maps the process to that pod, as it maps a
real workload through the host's /proc.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tessera.api import contract
from tessera_agent.pods import NodePod, pod_info_from_manifest

PEER_SCRIPT = str(Path(__file__).parent / "socket_peer.py")
NODE = "node-a"


def pod_uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def lane_pod(namespace: str, name: str, n: int, lane: str | None) -> NodePod:
    annotations = {}
    if lane is not None:
        annotations[contract.ANN_ASSIGNMENT] = json.dumps(
            {
                "node": NODE,
                "gpuUUIDs": ["GPU-0"],
                "gpuIndices": [0],
                "laneId": lane,
                "memoryMiB": 1024,
                "computePercent": 50,
            }
        )
    return pod_info_from_manifest(
        {
            "metadata": {"namespace": namespace, "name": name, "uid": pod_uid(n), "annotations": annotations},
            "spec": {"nodeName": NODE},
        }
    )


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root

    def place(self, pid: int, uid: str | None, *, form: str = "systemd") -> None:
        """Put `pid` in pod `uid` (None: a host process outside any pod) with cgroup v2 or v1 path forms."""
        if uid is None:
            text = "0::/user.slice/user-65534.slice/session-1.scope\n"
        elif form == "systemd":
            text = (
                "0::/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-abc.scope\n"
            )
        else:  # cgroup v1, cgroupfs driver: one line per controller
            text = "".join(
                f"{i}:{c}:/kubepods/burstable/pod{uid}/0123456789abcdef\n"
                for i, c in enumerate(["memory", "cpu,cpuacct", "pids"], start=2)
            )
        (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "cgroup").write_text(text)


class Peer:
    """One `socket_peer.py` process; `await Peer.start(fake, pod_uid)` places it in a pod and lets it go."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls, fake: FakeProc | None, uid: str | None, *, form: str = "systemd", user: int | None = None
    ) -> Peer:
        """`user`: run as that uid (and gid, no other groups); the test must run as root for it."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            PEER_SCRIPT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        if fake is not None:
            fake.place(proc.pid, uid, form=form)
        peer = cls(proc)
        assert await peer.ask("go") == {"ready": True}
        if user is not None:
            assert await peer.ask(f"become {user}") == {"uid": user}
        return peer

    async def ask(self, line: str, timeout_s: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        out = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        assert out, f"peer process exited (rc {self.proc.returncode}) on {line!r}"
        reply: dict[str, Any] = json.loads(out)
        return reply

    async def send(self, payload: bytes | dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode() + b"\n"
        return await self.ask(f"send {raw.hex()}", timeout_s)

    async def close(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"exit\n")
            try:
                await self.proc.stdin.drain()
                await asyncio.wait_for(self.proc.wait(), 10)
            except (TimeoutError, ConnectionResetError, BrokenPipeError):
                self.proc.kill()
                await self.proc.wait()


class LoopThread:
    """An event loop in a background thread, so synchronous tests (hypothesis) can drive async servers."""

    def __init__(self) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class ErrorLog:
    """Collects log records that carry a traceback or are errors, from every logger, while installed."""

    def __init__(self) -> None:
        import logging

        self.records: list[logging.LogRecord] = []
        collector = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.exc_info or record.levelno >= logging.ERROR or "Traceback" in record.getMessage():
                    collector.records.append(record)

        self._handler = _Handler(level=logging.DEBUG)
        self._root = logging.getLogger()

    def __enter__(self) -> ErrorLog:
        self._root.addHandler(self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._root.removeHandler(self._handler)

    def messages(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records]
