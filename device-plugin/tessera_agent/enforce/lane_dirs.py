"""Each lane's own host directories: its MPS pipe directory (its daemon's control socket) and its /dev/shm.

A lane is one pod's share (device-plugin mode) or one claim's (DRA); its directories sit under
`<mps root>/lanes/<key>` and are removed with the lane, so no container is given a socket or shared memory
that another tenant's lane uses, nor the daemons' logs.

`LaneLayout` says which host directories a lane's containers get. Legacy MPS: the lane's pipe directory,
its daemon's control socket in it. MPS v3: only the lane's namespace directory in its daemon's pipe
directory (`<pipe>/<server>/<namespace>`), never the daemon's control socket. With v3 servers shared per
GPU set (`sharing: gpu`) the daemon's directories are the GPU set's, under `<mps root>/servers/<set>`.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tessera_agent.enforce import mps_v3

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # pod and claim UIDs


@dataclass(frozen=True)
class LanePaths:
    root: Path
    pipe: Path  # CUDA_MPS_PIPE_DIRECTORY of the lane's daemon and of its clients
    log: Path  # the daemon's CUDA_MPS_LOG_DIRECTORY; never mounted into a workload
    shm: Path  # bound to /dev/shm in the lane's containers and in its daemon's mount namespace


class LaneDirs:
    def __init__(self, mps_root: Path, kind: Literal["lanes", "servers"] = "lanes") -> None:
        self.root = mps_root / kind

    def paths(self, key: str) -> LanePaths:
        if not _KEY.fullmatch(key):
            raise ValueError(f"a lane key must be a UID-like name, got {key!r}")
        root = self.root / key
        return LanePaths(root, root / "pipe", root / "log", root / "shm")

    def create(self, key: str, *, own_daemon: bool = True) -> LanePaths:
        """The directories; without `own_daemon` (a lane of a shared v3 server) only the lane's root, which
        records that the lane is set up."""
        p = self.paths(key)
        p.root.mkdir(parents=True, exist_ok=True)
        if not own_daemon:
            return p
        for d in (p.pipe, p.log, p.shm):
            d.mkdir(parents=True, exist_ok=True)
        # Mounted only into this lane's containers, whose user may not be root: the pipe and shm as the
        # daemon's clients need them, shm sticky as /dev/shm is.
        p.pipe.chmod(0o777)
        p.shm.chmod(0o1777)
        p.log.chmod(0o700)
        return p

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and _KEY.fullmatch(d.name))

    def remove(self, key: str) -> None:
        shutil.rmtree(self.paths(key).root, ignore_errors=True)


Sharing = Literal["lane", "gpu"]  # a daemon per lane, or (MPS v3) a daemon and server per GPU set


@dataclass(frozen=True)
class LaneLayout:
    """Where a lane's daemon keeps its directories, and which of them the lane's containers are given."""

    mps_root: Path
    generation: mps_v3.Generation = "legacy"
    sharing: Sharing = "lane"

    def __post_init__(self) -> None:
        if self.sharing == "gpu" and self.generation != "v3":
            raise ValueError("servers shared per GPU need MPS v3 namespaces; legacy clients reach the daemon")

    def group(self, lane: str, gpus: Sequence[str]) -> str:
        """The daemon that serves a lane: its own, or its GPU set's."""
        if self.sharing == "lane":
            return lane
        return "gpus-" + hashlib.sha256(",".join(sorted(gpus)).encode()).hexdigest()[:20]

    def daemon_dirs(self) -> LaneDirs:
        return LaneDirs(self.mps_root, "lanes" if self.sharing == "lane" else "servers")

    def daemon_paths(self, lane: str, gpus: Sequence[str]) -> LanePaths:
        return self.daemon_dirs().paths(self.group(lane, gpus))

    def lane_paths(self, lane: str, gpus: Sequence[str]) -> LanePaths:
        """What the lane's containers mount: `pipe` (their CUDA_MPS_PIPE_DIRECTORY) and `shm` (/dev/shm)."""
        daemon = self.daemon_paths(lane, gpus)
        if self.generation == "legacy":
            return daemon
        own = LaneDirs(self.mps_root).paths(lane).root
        pipe = daemon.pipe / mps_v3.SERVER / mps_v3.namespace_name(lane)
        return LanePaths(own, pipe, daemon.log, daemon.shm)
