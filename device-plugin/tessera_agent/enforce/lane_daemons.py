"""The MPS control daemons that enforce lanes' limits server-side, one per lane or (MPS v3) one per GPU set.

Legacy MPS (v2): each lane has its own daemon, which sees only the lane's GPUs and holds the lane's limits as
its defaults (`set_default_device_pinned_mem_limit`, `set_default_active_thread_percentage`,
`set_default_client_priority`), so what a client puts in its env can only lower them, and nothing it sends its
own daemon reaches another lane's. The lane's containers get the daemon's pipe directory.

MPS v3 (`generation: v3`): each daemon runs one server (`mps_v3.SERVER`) on its GPUs, and each lane is a
namespace in it with its three limits; the lane's containers get only their namespace's directory, never the
daemon's control socket. With `sharing: lane` (the default) a lane still has a daemon of its own; with
`sharing: gpu` the lanes on one GPU set share a daemon and server, so their kernels run concurrently instead of
time-sliced between servers, at the price of one /dev/shm for the server and all its clients (MPS's transport).

A daemon starts in a mount namespace whose /dev/shm is its own directory. Without MPS (`--no-mps`) a lane still
gets its own directories; its limits are then declared, not enforced. After each change the GPUs' compute
modes follow (`compute_mode.py`): EXCLUSIVE_PROCESS where one daemon serves a GPU.
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

from tessera_agent.enforce import mps_v3
from tessera_agent.enforce.compute_mode import ComputeModes
from tessera_agent.enforce.lane_dirs import LaneDirs, LaneLayout, LanePaths
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

    def namespace_commands(self, lane: str) -> list[list[str]]:
        """v3: the lane's namespace and its limits. v3 takes one pinned limit per namespace, applied on each of
        its GPUs: a lane with different shares on its GPUs gets the smallest."""
        return [
            mps_v3.create_namespace(lane),
            mps_v3.set_namespace(
                lane,
                min(self.memory_mib),
                self.thread_percent,
                0 if self.client_priority is None else self.client_priority,
            ),
        ]


@dataclass
class _Daemon:
    """One control daemon and the lanes it serves (v3: its namespaces, re-created after each restart)."""

    gpus: tuple[str, ...]
    paths: LanePaths
    lanes: dict[str, LaneLimits]
    manager: MpsManager | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class LaneDaemons:
    dirs: LaneDirs
    mps: bool = True  # False: directories only (no MPS on this node; limits declared, not enforced)
    binary: str = CONTROL_BINARY
    mem_limit_key: Literal["ordinal", "uuid"] = "ordinal"
    check_interval_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    layout: LaneLayout | None = None  # None: legacy, a daemon per lane, under dirs
    compute_modes: ComputeModes | None = None  # None: compute modes left as they are
    _daemons: dict[str, _Daemon] = field(default_factory=dict)  # group → its daemon
    _lane_group: dict[str, str] = field(default_factory=dict)
    _created: dict[str, float] = field(default_factory=dict)  # key → clock() when its lane was set up

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = LaneLayout(self.dirs.root.parent)

    @classmethod
    def directories_only(cls, mps_root: Path) -> LaneDaemons:
        """Each lane's directories and no daemon: what a part built without MPS (tests, demos) gets."""
        return cls(LaneDirs(mps_root), mps=False)

    @property
    def v3(self) -> bool:
        return self._layout.generation == "v3"

    @property
    def _layout(self) -> LaneLayout:
        assert self.layout is not None  # set in __post_init__
        return self.layout

    def running(self, key: str) -> MpsManager | None:
        group = self._lane_group.get(key)
        daemon = self._daemons.get(group) if group is not None else None
        return daemon.manager if daemon is not None and key in daemon.lanes else None

    async def ensure(self, key: str, limits: LaneLimits) -> LanePaths:
        """The lane's directories, and its daemon (or namespace) set up with `limits` (raises MpsError when it
        cannot be). Returns the host directories its containers mount."""
        own_daemon = self._layout.sharing == "lane"
        self.dirs.create(key, own_daemon=own_daemon or not self.mps)
        self._created.setdefault(key, self.clock())
        if not self.mps:
            return self.dirs.paths(key)
        paths = self._layout.lane_paths(key, limits.gpus)
        if key in self._lane_group:
            return paths
        group = self._layout.group(key, limits.gpus)
        daemon = self._daemons.get(group)
        if daemon is None:
            dirs = self._layout.daemon_dirs()
            daemon = _Daemon(limits.gpus, dirs.create(group), {key: limits})
            await self._start(group, daemon)
        else:  # v3, a running server of the lane's GPU set: add the lane's namespace
            assert daemon.manager is not None
            try:
                for command in limits.namespace_commands(key):
                    await daemon.manager.cli(*command)
            except MpsError:
                # a namespace created but not limited would give the whole GPU: take it away again
                with contextlib.suppress(MpsError):
                    await daemon.manager.cli(*mps_v3.delete_namespace(key))
                raise
            daemon.lanes[key] = limits
        self._lane_group[key] = group
        if not own_daemon:  # which server's directories the lane's containers mount, for sync after a restart
            (self.dirs.paths(key).root / "server").write_text(group)
        self._follow_compute_modes()
        log.info("lane %s: %s", key, self._describe(key, limits))
        return paths

    async def update(self, key: str, limits: LaneLimits) -> None:
        """Give a running lane new limits (the BE feedback loop's new share for a DRA claim that stays prepared):
        legacy, its daemon's defaults, which servers started later take; v3, its namespace's. A restarted
        daemon applies them too. A lane without a daemon has nothing to change; MpsError when it does not answer."""
        group = self._lane_group.get(key)
        daemon = self._daemons.get(group) if group is not None else None
        if daemon is None or key not in daemon.lanes or daemon.manager is None:
            return
        daemon.lanes[key] = limits
        if self.v3:
            await daemon.manager.cli(*limits.namespace_commands(key)[1])
            return
        daemon.manager.defaults = limits.defaults(self.mem_limit_key)
        for command in daemon.manager.defaults.commands():
            await daemon.manager.command(command)

    async def _start(self, group: str, daemon: _Daemon) -> None:
        v3 = self.v3

        async def setup(manager: MpsManager) -> None:
            await manager.cli(*mps_v3.create_server(daemon.gpus))
            for lane, limits in daemon.lanes.items():
                for command in limits.namespace_commands(lane):
                    await manager.cli(*command)

        async def health(manager: MpsManager) -> None:
            if (await manager.cli(*mps_v3.server_status())).strip() != "Ready":
                # e.g. a server whose allowed GPU is missing exits, and its clients would run without MPS
                raise MpsError(f"server {mps_v3.SERVER} is not Ready")

        (only,) = daemon.lanes.values()
        manager = MpsManager(
            daemon.paths.pipe,
            daemon.paths.log,
            binary=self.binary,
            defaults=None if v3 else only.defaults(self.mem_limit_key),
            env={"CUDA_VISIBLE_DEVICES": ",".join(daemon.gpus)},
            shm_dir=daemon.paths.shm,
            protocol=3 if v3 else 2,
            setup=setup if v3 else None,
            health=health if v3 else None,
            check_interval_s=self.check_interval_s,
        )
        try:
            await manager.start()
        except MpsError:
            with contextlib.suppress(MpsError):
                await manager.stop()
            if self._layout.sharing == "gpu":
                self._layout.daemon_dirs().remove(group)
            raise
        daemon.manager = manager
        daemon.task = asyncio.create_task(manager.run(daemon.stop))
        self._daemons[group] = daemon

    def _describe(self, key: str, limits: LaneLimits) -> str:
        if self.v3:
            return "MPS v3 namespace with " + " ".join(limits.namespace_commands(key)[1][3:])
        return "MPS daemon with " + " / ".join(limits.defaults(self.mem_limit_key).commands())

    async def release(self, key: str) -> None:
        """End the lane: its namespace deleted (v3), its daemon stopped once it serves no lane, its
        directories removed."""
        group = self._lane_group.pop(key, None)
        daemon = self._daemons.get(group) if group is not None else None
        if daemon is not None:
            daemon.lanes.pop(key, None)
            if daemon.lanes and daemon.manager is not None:
                with contextlib.suppress(MpsError):  # a daemon that does not answer is restarted without it
                    await daemon.manager.cli(*mps_v3.delete_namespace(key))
            else:
                del self._daemons[group]  # type: ignore[arg-type]
                await _stop(daemon)
                if self._layout.sharing == "gpu":
                    self._layout.daemon_dirs().remove(group)  # type: ignore[arg-type]
        self._created.pop(key, None)
        self.dirs.remove(key)
        self._follow_compute_modes()
        log.info("lane %s released", key)

    async def sync(self, live: Collection[str], listed_at: float) -> list[str]:
        """Release every lane whose pod or claim is not in `live`, a listing taken at clock() `listed_at`
        (a lane set up after that listing is kept: its pod may be missing from it). Returns what went."""
        known = set(self._created) | set(self.dirs.names())
        gone = [k for k in sorted(known) if k not in live and self._created.get(k, 0.0) < listed_at]
        for key in gone:
            await self.release(key)
        if self._layout.sharing == "gpu":  # a shared server's directories that no lane mounts any more
            mounted = set(self._daemons)
            for key in self.dirs.names():
                with contextlib.suppress(OSError):
                    mounted.add((self.dirs.paths(key).root / "server").read_text().strip())
            servers = self._layout.daemon_dirs()
            for group in sorted(set(servers.names()) - mounted):
                servers.remove(group)
        return gone

    async def close(self) -> None:
        """Stop every daemon, leaving the directories (the lanes' containers may outlive the agent), and give
        the GPUs back their modes: with no MPS server left, an exclusive GPU would go to the first process that
        opens it, and the next agent's server could not start there."""
        for group in list(self._daemons):
            await _stop(self._daemons.pop(group))
        self._lane_group.clear()
        self._follow_compute_modes()

    def _follow_compute_modes(self) -> None:
        if self.compute_modes is None:
            return
        served: dict[str, int] = {}
        for daemon in self._daemons.values():
            for gpu in daemon.gpus:
                served[gpu] = served.get(gpu, 0) + 1
        self.compute_modes.follow(served)


async def _stop(daemon: _Daemon) -> None:
    """End a daemon's health loop, which asks the daemon to quit on its way out."""
    daemon.stop.set()
    if daemon.task is None or daemon.manager is None:
        return
    with contextlib.suppress(Exception):  # a daemon that does not answer is left to the agent's exit
        await asyncio.wait_for(daemon.task, daemon.manager.command_timeout_s + 5)
