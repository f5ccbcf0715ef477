"""`tessera-agent` end to end as a process: fake GPUs, fake MPS binary, fake kubelet; SIGTERM shuts it down."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.ports import free_port

from .agent_fake_kubelet import FakeKubelet

FAKE_MPS = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")


async def test_agent_process_registers_and_stops_cleanly(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        "--node",
        "n1",
        "--fake-gpus",
        "2",
        "--device-plugin-dir",
        str(plugin_dir),
        "--mps-root",
        str(plugin_dir / "mps"),
        "--mps-binary",
        FAKE_MPS,
        "--metrics-port",
        "0",
        "--coordinator-socket",
        str(plugin_dir / "coord.sock"),
    )
    try:
        await asyncio.wait_for(kubelet.registered.wait(), 20)
        assert kubelet.requests[0].resource_name == "tessera.io/gpu"
        for _ in range(200):
            if (plugin_dir / "coord.sock").exists():
                break
            await asyncio.sleep(0.05)
        assert (plugin_dir / "coord.sock").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 20)
    assert rc == 0
    assert not (plugin_dir / "tessera-gpu.sock").exists() and not (plugin_dir / "coord.sock").exists()
    # No node-wide MPS daemon or pipe: each lane has its own (test_agent_lane_enforcement.py).
    assert not (plugin_dir / "mps" / "pipe").exists()


async def _get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, await resp.text()


async def _wait_for(port: int, path: str, status: int, deadline_s: float = 30.0) -> str:
    """The body once `path` answers `status`; connection refusals and other answers are waited out."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    last: object = None
    while loop.time() < end:
        try:
            got, body = await _get(port, path)
            if got == status:
                return body
            last = (got, body)
        except aiohttp.ClientConnectionError as err:
            last = err
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never answered {status} in {deadline_s}s; last: {last}")


async def test_readyz_answers_503_until_the_kubelet_takes_the_device_plugin(plugin_dir: Path) -> None:
    """The pod's probes: live as soon as the loop runs; Ready only once the kubelet has the plugin."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tessera_agent.cli", "--node", "n1", "--fake-gpus", "2",
        "--device-plugin-dir", str(plugin_dir), "--mps-root", str(plugin_dir / "mps"), "--mps-binary", FAKE_MPS,
        "--metrics-port", "0", "--health-port", str(port),
    )  # fmt: skip
    kubelet = FakeKubelet(plugin_dir)
    try:
        assert await _wait_for(port, "/healthz", 200) == "ok\n"
        waiting = json.loads(await _wait_for(port, "/readyz", 503))
        assert waiting["ready"] is False
        assert "waiting for the kubelet" in waiting["reason"] and "tessera.io/gpu" in waiting["reason"]
        await kubelet.start()  # no kubelet socket until now: the agent retries its Register
        await asyncio.wait_for(kubelet.registered.wait(), 30)
        assert await _wait_for(port, "/readyz", 200) == "ok\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 20)
        await kubelet.stop()
    assert rc == 0
    with pytest.raises(aiohttp.ClientConnectionError):  # the endpoints go with the process
        await _get(port, "/healthz")
