"""Runs and watches one MPS control daemon (`nvidia-cuda-mps-control -d`) (NVIDIA MPS documentation).

Each daemon serves one lane, or with MPS v3 and servers shared per GPU the lanes of one GPU set
(`enforce/lane_daemons.py`); it sees only those GPUs (CUDA_VISIBLE_DEVICES on the daemon). Legacy (v2): its
defaults are the lane's limits, set through control commands after start (§3.1), so a client's env can only
lower them. v3 (`-p 3`): after each start a setup step creates its server and its lanes' namespaces with their
limits (`enforce/mps_v3.py`). With a shm directory the daemon starts in a private mount namespace with that
directory on /dev/shm: the servers it spawns share memory with their clients and no one else. A health check
sends a read-only command; when the daemon stops answering it is restarted with exponential backoff and its
limits set again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tessera.api import contract

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
HEALTH_COMMAND = "get_default_active_thread_percentage"  # what NVIDIA's daemon uses as its health check
MpsProtocol = Literal[2, 3]  # the legacy interface, or MPS v3 (driver r615+): servers and namespaces


class MpsError(RuntimeError):
    """The MPS control daemon could not be started or did not accept a command."""


class MpsPhase(enum.StrEnum):
    STOPPED = "Stopped"
    RUNNING = "Running"
    BACKOFF = "BackOff"  # crashed or failed to start; waiting to retry


@dataclass(frozen=True)
class MpsDefaults:
    """Daemon-wide defaults applied after each start (they affect servers spawned afterwards)."""

    active_thread_percentage: int | None = None
    # by device as the daemon names it: an ordinal among the GPUs it sees, or a UUID
    pinned_mem_limit_mib: dict[int | str, int] = field(default_factory=dict)
    client_priority: int | None = None  # 0 normal, 1 below normal (the daemon's default for its clients)

    def commands(self) -> list[str]:
        out = []
        if self.active_thread_percentage is not None:
            if not 1 <= self.active_thread_percentage <= 100:
                raise ValueError(
                    f"active thread percentage must be 1..100, got {self.active_thread_percentage}"
                )
            out.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        for device, mib in sorted(self.pinned_mem_limit_mib.items(), key=lambda kv: str(kv[0])):
            if mib <= 0:
                raise ValueError(f"pinned memory limit for GPU {device} must be positive, got {mib} MiB")
            out.append(f"set_default_device_pinned_mem_limit {device} {mib}M")
        if self.client_priority is not None:
            if self.client_priority not in (0, 1):
                raise ValueError(f"client priority must be 0 or 1, got {self.client_priority}")
            out.append(f"set_default_client_priority {self.client_priority}")
        return out


@dataclass(frozen=True)
class MpsState:
    phase: MpsPhase
    restarts: int
    last_error: str | None
    retry_in_s: float | None


class MpsManager:
    def __init__(
        self,
        pipe_dir: Path,
        log_dir: Path,
        *,
        binary: str = CONTROL_BINARY,
        defaults: MpsDefaults | None = None,
        env: dict[str, str] | None = None,
        shm_dir: Path | None = None,
        protocol: MpsProtocol = 2,
        setup: Callable[[MpsManager], Awaitable[None]] | None = None,
        health: Callable[[MpsManager], Awaitable[None]] | None = None,
        check_interval_s: float = 5.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        command_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary
        self.defaults = defaults or MpsDefaults()
        self.defaults.commands()  # validate now, not after the first start
        self.env = dict(env or {})  # e.g. CUDA_VISIBLE_DEVICES: the GPUs the daemon's server may use
        self.shm_dir = shm_dir
        self.protocol: MpsProtocol = protocol
        self._setup = setup  # after each start: v3's server and namespaces (legacy sets its defaults)
        self._health = health  # a read-only command that fails when the daemon is not serving
        self.check_interval_s = check_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.command_timeout_s = command_timeout_s
        self._clock = clock
        self._phase = MpsPhase.STOPPED
        self._restarts = 0
        self._last_error: str | None = None
        self._retry_at: float | None = None
        self.start_times: list[float] = []  # clock() of each successful start, for backoff checks

    def state(self) -> MpsState:
        retry = None if self._retry_at is None else max(0.0, self._retry_at - self._clock())
        return MpsState(self._phase, self._restarts, self._last_error, retry)

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.env,
            contract.ENV_MPS_PIPE_DIRECTORY: str(self.pipe_dir),
            contract.ENV_MPS_LOG_DIRECTORY: str(self.log_dir),
        }

    async def _exec(self, args: list[str], stdin: str | None) -> tuple[int, str, str]:
        argv = [self.binary, *args]
        if args[:1] == ["-d"] and self.shm_dir is not None:
            # The daemon (and the servers it forks) keep this namespace: their /dev/shm is the lane's.
            script = 'mount --bind "$0" /dev/shm && exec "$@"'
            argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
            argv += [str(self.shm_dir), self.binary, *args]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(),
            )
        except FileNotFoundError as err:
            raise MpsError(
                f"{argv[0]} not found; install the NVIDIA driver utilities or pass --mps-binary"
            ) from err
        try:
            out, errb = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), self.command_timeout_s
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise MpsError(
                f"{self.binary} {' '.join(args)} did not finish in {self.command_timeout_s}s"
            ) from None
        return proc.returncode or 0, out.decode().strip(), errb.decode().strip()

    async def command(self, cmd: str) -> str:
        """Send one control command (`echo cmd | nvidia-cuda-mps-control`) and return its answer."""
        rc, out, err = await self._exec([], cmd + "\n")
        if rc != 0:
            raise MpsError(f"MPS control command {cmd!r} failed (exit {rc}): {err or out or 'no output'}")
        return out

    async def cli(self, *args: str) -> str:
        """Run one v3 command (`nvidia-cuda-mps-control <module> <verb> ...`) and return its answer."""
        rc, out, err = await self._exec(list(args), None)
        if rc != 0:
            raise MpsError(f"MPS command {' '.join(args)!r} failed (exit {rc}): {err or out or 'no output'}")
        return out

    async def start(self) -> None:
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        if self.shm_dir is not None:
            self.shm_dir.mkdir(parents=True, exist_ok=True)
        start = ["-d"] if self.protocol == 2 else ["-d", "-p", "3"]
        rc, out, err = await self._exec(start, None)
        if rc != 0:
            raise MpsError(f"{self.binary} {' '.join(start)} exited {rc}: {err or out or 'no output'}")
        for cmd in self.defaults.commands():
            await self.command(cmd)
        if self._setup is not None:
            await self._setup(self)
        self._phase = MpsPhase.RUNNING
        self._retry_at = None
        self.start_times.append(self._clock())
        log.info("MPS control daemon running (pipe %s, log %s)", self.pipe_dir, self.log_dir)

    async def healthy(self) -> bool:
        try:
            if self._health is not None:
                await self._health(self)
            else:
                await self.command(HEALTH_COMMAND)
            return True
        except MpsError as err:
            self._last_error = str(err)
            return False

    async def stop(self) -> None:
        """Ask the daemon to quit (never SIGKILL: clients mid-kernel would leave the server undefined, §3.3)."""
        if self._phase is MpsPhase.RUNNING:
            with contextlib.suppress(MpsError):
                if self.protocol == 2:
                    await self.command("quit")
                else:
                    await self.cli("-q")  # v3: the daemon and every server it runs
        self._phase = MpsPhase.STOPPED

    async def run(self, stop: asyncio.Event) -> None:
        """Start, then check health every interval; restart with doubling backoff after a crash."""
        backoff = self.backoff_initial_s
        first = True
        try:
            while not stop.is_set():
                if self._phase is not MpsPhase.RUNNING:
                    try:
                        if not first:
                            self._restarts += 1
                        first = False
                        await self.start()
                    except MpsError as err:
                        self._fail(str(err), backoff)
                        await _sleep_or_stop(stop, backoff)
                        backoff = min(backoff * 2, self.backoff_max_s)
                        continue
                await _sleep_or_stop(stop, self.check_interval_s)
                if stop.is_set():
                    break
                if await self.healthy():
                    backoff = self.backoff_initial_s  # reset only once a start has proven stable
                else:
                    self._fail(self._last_error or "daemon stopped answering", backoff)
                    await _sleep_or_stop(stop, backoff)
                    backoff = min(backoff * 2, self.backoff_max_s)
        finally:
            await self.stop()

    def _fail(self, reason: str, backoff: float) -> None:
        self._phase = MpsPhase.BACKOFF
        self._last_error = reason
        self._retry_at = self._clock() + backoff
        log.warning("MPS control daemon down (%s); restarting in %.1fs", reason, backoff)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
