"""One MPS control daemon per lane, its limits set server-side (the legacy MPS v2 interface).

A lane's containers get only their own daemon's pipe directory; the daemon sees only the lane's GPUs and
holds the lane's limits as its defaults (`set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`, `set_default_client_priority`), so what a client puts in its env can
only lower them, and nothing it sends its own daemon reaches another lane's. The daemon starts in a mount
namespace whose /dev/shm is the lane's, the memory its server shares with the lane's clients alone. Without
MPS (`--no-mps`) a lane still gets its own directories; its limits are then declared, not enforced.

Lanes on one GPU with separate daemons have separate MPS servers, which the GPU time-slices between rather
than running concurrently: the price of not sharing a control socket across tenants on drivers without MPS
namespaces (docs/node-agent.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tessera_agent.enforce.lane_dirs import LaneDirs, LanePaths
from tessera_agent.enforce.mps import CONTROL_BINARY, MpsDefaults, MpsError, MpsManager

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneLimits:
    """What a lane's daemon enforces: memory per GPU, active threads, client priority (None: MPS's)."""

    gpus: tuple[str, ...]  # UUIDs, in the order the container sees them
    memory_mib: tuple[int, ...]  # per GPU, in the same order
    thread_percent: int
    client_priority: int | None = None

    def defaults(self, key: Literal["ordinal", "uuid"]) -> MpsDefaults:
        # The daemon runs with CUDA_VISIBLE_DEVICES set to the lane's GPUs, so ordinals are the lane's 0..n-1.
        devices: list[int | str] = list(range(len(self.gpus))) if key == "ordinal" else list(self.gpus)
        return MpsDefaults(
            active_thread_percentage=self.thread_percent,
            pinned_mem_limit_mib=dict(zip(devices, self.memory_mib, strict=True)),
            client_priority=self.client_priority,
        )


@dataclass
class _Running:
    manager: MpsManager
    stop: asyncio.Event
    task: asyncio.Task[None]


@dataclass
class LaneDaemons:
    dirs: LaneDirs
    mps: bool = True  # False: directories only (no MPS on this node; limits declared, not enforced)
    binary: str = CONTROL_BINARY
    mem_limit_key: Literal["ordinal", "uuid"] = "ordinal"
    check_interval_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _running: dict[str, _Running] = field(default_factory=dict)
    _created: dict[str, float] = field(default_factory=dict)  # key → clock() when its lane was set up

    @classmethod
    def directories_only(cls, mps_root: Path) -> LaneDaemons:
        """Each lane's directories and no daemon: what a part built without MPS (tests, demos) gets."""
        return cls(LaneDirs(mps_root), mps=False)

    def running(self, key: str) -> MpsManager | None:
        r = self._running.get(key)
        return r.manager if r is not None else None

    async def ensure(self, key: str, limits: LaneLimits) -> LanePaths:
        """The lane's directories, and its daemon started with `limits` (raises MpsError when it cannot be)."""
        paths = self.dirs.create(key)
        self._created.setdefault(key, self.clock())
        if not self.mps or key in self._running:
            return paths
        manager = MpsManager(
            paths.pipe,
            paths.log,
            binary=self.binary,
            defaults=limits.defaults(self.mem_limit_key),
            env={"CUDA_VISIBLE_DEVICES": ",".join(limits.gpus)},
            shm_dir=paths.shm,
            check_interval_s=self.check_interval_s,
        )
        try:
            await manager.start()
        except MpsError:
            with contextlib.suppress(MpsError):
                await manager.stop()
            raise
        stop = asyncio.Event()
        self._running[key] = _Running(manager, stop, asyncio.create_task(manager.run(stop)))
        log.info(
            "lane %s: MPS daemon with %s", key, " / ".join(limits.defaults(self.mem_limit_key).commands())
        )
        return paths

    async def release(self, key: str) -> None:
        """Stop the lane's daemon (`quit`) and remove its directories."""
        running = self._running.pop(key, None)
        if running is not None:
            await _stop(running)
        self._created.pop(key, None)
        self.dirs.remove(key)
        log.info("lane %s released", key)

    async def sync(self, live: Collection[str], listed_at: float) -> list[str]:
        """Release every lane whose pod or claim is not in `live`, a listing taken at clock() `listed_at`
        (a lane set up after that listing is kept: its pod may be missing from it). Returns what went."""
        known = set(self._created) | set(self.dirs.keys())
        gone = [k for k in sorted(known) if k not in live and self._created.get(k, 0.0) < listed_at]
        for key in gone:
            await self.release(key)
        return gone

    async def close(self) -> None:
        """Stop every daemon, leaving the directories (the lanes' containers may outlive the agent)."""
        for key in list(self._running):
            await _stop(self._running.pop(key))


async def _stop(running: _Running) -> None:
    """End a daemon's health loop, which asks the daemon to quit on its way out."""
    running.stop.set()
    with contextlib.suppress(Exception):  # a daemon that does not answer is left to the agent's exit
        await asyncio.wait_for(running.task, running.manager.command_timeout_s + 5)
