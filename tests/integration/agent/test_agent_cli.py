"""`tessera-agent` end to end as a process: fake GPUs, fake MPS binary, fake kubelet; SIGTERM shuts it down."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

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
