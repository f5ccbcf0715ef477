"""The MPS manager against a fake `nvidia-cuda-mps-control` that records what it is sent (issue 7)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tessera_agent.enforce.mps import MpsDefaults, MpsError, MpsManager, MpsPhase

from .waiting import until

FAKE = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")


@pytest.fixture
def mps_root(plugin_dir: Path) -> Iterator[Path]:
    yield plugin_dir / "mps"
    pid_file = plugin_dir / "mps" / "pipe" / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():  # never leave a fake daemon behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def commands(root: Path) -> list[tuple[float, str]]:
    lines = (root / "pipe" / "commands.log").read_text().splitlines()
    return [(float(t), c) for t, c in (line.split(" ", 1) for line in lines)]


def kill_daemon(root: Path) -> None:
    os.kill(int((root / "pipe" / "nvidia-cuda-mps-control.pid").read_text()), signal.SIGKILL)


@pytest.fixture
async def manager(mps_root: Path) -> AsyncIterator[tuple[MpsManager, asyncio.Event]]:
    mgr = MpsManager(
        mps_root / "pipe",
        mps_root / "log",
        binary=FAKE,
        defaults=MpsDefaults(active_thread_percentage=100, pinned_mem_limit_mib={0: 39000, 1: 20000}),
        check_interval_s=0.1,
        backoff_initial_s=0.4,
        backoff_max_s=2.0,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.run(stop))
    yield mgr, stop
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_start_applies_defaults(manager: tuple[MpsManager, asyncio.Event], mps_root: Path) -> None:
    mgr, _ = manager
    await until(lambda: mgr.state().phase is MpsPhase.RUNNING, "the daemon running")
    sent = [c for _, c in commands(mps_root)]
    assert sent[:4] == [
        "-d",
        "set_default_active_thread_percentage 100",
        "set_default_device_pinned_mem_limit 0 39000M",
        "set_default_device_pinned_mem_limit 1 20000M",
    ]
    assert await mgr.command("get_default_device_pinned_mem_limit 1") == "20000M"
    assert (mps_root / "log").is_dir()


async def test_crash_restarts_with_doubling_backoff(
    manager: tuple[MpsManager, asyncio.Event], mps_root: Path
) -> None:
    mgr, _ = manager
    await until(lambda: len(mgr.start_times) == 1, "the first start")
    kill_daemon(mps_root)
    await until(lambda: mgr.state().phase is MpsPhase.BACKOFF, "backoff")
    st = mgr.state()
    assert (
        st.retry_in_s is not None
        and st.retry_in_s <= 0.4
        and "Cannot find MPS control daemon" in (st.last_error or "")
    )
    await until(lambda: len(mgr.start_times) == 2, "the second start")
    kill_daemon(mps_root)  # crash again before a health check proves the restart stable
    await until(lambda: len(mgr.start_times) == 3, "the third start")
    gaps = [b - a for a, b in zip(mgr.start_times, mgr.start_times[1:], strict=False)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.8, gaps
    assert mgr.state().restarts == 2 and mgr.state().phase is MpsPhase.RUNNING
    # defaults are applied again after every start
    starts = [c for _, c in commands(mps_root)].count("-d")
    sets = [c for _, c in commands(mps_root)].count("set_default_active_thread_percentage 100")
    assert starts == sets == 3


async def test_stop_sends_quit(mps_root: Path) -> None:
    mgr = MpsManager(mps_root / "pipe", mps_root / "log", binary=FAKE, check_interval_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.run(stop))
    await until(lambda: mgr.state().phase is MpsPhase.RUNNING, "the daemon running")
    stop.set()
    await asyncio.wait_for(task, 10)
    assert commands(mps_root)[-1][1] == "quit"
    assert mgr.state().phase is MpsPhase.STOPPED
    assert not await mgr.healthy()


async def test_missing_binary_is_a_clear_error(mps_root: Path) -> None:
    mgr = MpsManager(mps_root / "pipe", mps_root / "log", binary="/nonexistent/nvidia-cuda-mps-control")
    with pytest.raises(MpsError, match="not found"):
        await mgr.start()


def test_invalid_defaults_rejected_up_front(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"1\.\.100"):
        MpsManager(tmp_path, tmp_path, defaults=MpsDefaults(active_thread_percentage=0))
