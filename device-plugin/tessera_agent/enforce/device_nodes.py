"""The device nodes a lane's container gets: its GPUs' `/dev/nvidiaN` and the driver's control nodes.

A container given these through the device plugin's `DeviceSpecs` (or CDI `deviceNodes`) reaches its GPUs with
plain runc, no NVIDIA runtime hook, and runc's device rules keep every other GPU's node closed to it.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera_agent.gpus.backend import GpuDevice

log = logging.getLogger(__name__)

# Opened by every CUDA process (nvidiactl) and for unified memory (nvidia-uvm, nvidia-uvm-tools).
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
NVIDIA_MAJOR = 195  # the GPUs' and nvidiactl's character-device major (nvidiactl is minor 255)
FAKE_UVM_MAJOR = 235  # the uvm major is dynamic on a real node; the fake nodes take one of the unassigned


class DeviceNodeError(RuntimeError):
    """A lane's device nodes cannot be named (a GPU without a minor number)."""


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"  # the device plugin API's cgroup permissions: r, w, m


def lane_device_nodes(gpus: Sequence[GpuDevice], dev_root: Path) -> list[DeviceNode]:
    """The nodes for a lane on `gpus`: each GPU's `/dev/nvidiaN`, then the control nodes; host paths under
    `dev_root` (the host's /dev, or a fake tree on a node without GPUs)."""
    nodes = []
    for gpu in gpus:
        if gpu.minor is None:
            raise DeviceNodeError(
                f"GPU {gpu.uuid} has no device minor number (NVML); its /dev node is unknown"
            )
        nodes.append(DeviceNode(f"/dev/nvidia{gpu.minor}", str(dev_root / f"nvidia{gpu.minor}")))
    nodes.extend(DeviceNode(f"/dev/{name}", str(dev_root / name)) for name in CONTROL_NODES)
    return nodes


def make_fake_device_nodes(gpus: Sequence[GpuDevice], dev_root: Path) -> None:
    """Character devices standing in for the driver's nodes on a node without GPUs (fake GPU backend only):
    the same names and majors, so runc gives a container exactly the nodes it was allocated; opening them
    fails (no driver), which is all a test needs."""
    if dev_root.resolve() == Path("/dev"):
        raise ValueError("fake device nodes are never made in the host's /dev; pass another --dev-root")
    dev_root.mkdir(parents=True, exist_ok=True)
    wanted = [(f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor) for g in gpus if g.minor is not None]
    wanted += [("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", FAKE_UVM_MAJOR, 0)]
    wanted += [("nvidia-uvm-tools", FAKE_UVM_MAJOR, 1)]
    for name, major, minor in wanted:
        path = dev_root / name
        if (
            path.exists()
            and stat.S_ISCHR(path.stat().st_mode)
            and path.stat().st_rdev == os.makedev(major, minor)
        ):
            continue
        path.unlink(missing_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(0o666)  # as the driver's nodes are; mknod's mode passed through the umask
    log.info("fake GPU device nodes under %s", dev_root)
