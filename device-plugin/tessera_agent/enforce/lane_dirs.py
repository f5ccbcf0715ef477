"""Each lane's own host directories: its MPS pipe directory (its daemon's control socket) and its /dev/shm.

A lane is one pod's share (device-plugin mode) or one claim's (DRA); its directories sit under
`<mps root>/lanes/<key>` and are removed with the lane, so no container is given a socket or shared memory
that another tenant's lane uses, nor the daemons' logs.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # pod and claim UIDs


@dataclass(frozen=True)
class LanePaths:
    root: Path
    pipe: Path  # CUDA_MPS_PIPE_DIRECTORY of the lane's daemon and of its clients
    log: Path  # the daemon's CUDA_MPS_LOG_DIRECTORY; never mounted into a workload
    shm: Path  # bound to /dev/shm in the lane's containers and in its daemon's mount namespace


class LaneDirs:
    def __init__(self, mps_root: Path) -> None:
        self.root = mps_root / "lanes"

    def paths(self, key: str) -> LanePaths:
        if not _KEY.fullmatch(key):
            raise ValueError(f"a lane key must be a UID-like name, got {key!r}")
        root = self.root / key
        return LanePaths(root, root / "pipe", root / "log", root / "shm")

    def create(self, key: str) -> LanePaths:
        p = self.paths(key)
        for d in (p.pipe, p.log, p.shm):
            d.mkdir(parents=True, exist_ok=True)
        # Mounted only into this lane's containers, whose user may not be root: the pipe and shm as the
        # daemon's clients need them, shm sticky as /dev/shm is.
        p.pipe.chmod(0o777)
        p.shm.chmod(0o1777)
        p.log.chmod(0o700)
        return p

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and _KEY.fullmatch(d.name))

    def remove(self, key: str) -> None:
        shutil.rmtree(self.paths(key).root, ignore_errors=True)
