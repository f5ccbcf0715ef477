"""Which mechanism enforces each lane limit on this node, said at start in the log and the metrics, and a
refusal to start where the limits asked for could not be enforced (docs/node-agent.md, "What a tenant can
and cannot do")."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tessera_agent.enforce import mps_v3
from tessera_agent.enforce.cgroups import MOUNTINFO
from tessera_agent.enforce.dmem import FIX, DmemNode, DmemUnavailable, detect
from tessera_agent.enforce.lane_dirs import LaneLayout
from tessera_agent.enforce.mps_v3 import Generation
from tessera_agent.gpus.backend import GpuDevice
from tessera_agent.metrics_factory import AgentMetrics

if TYPE_CHECKING:
    from tessera_agent.config import AgentConfig

log = logging.getLogger(__name__)

MPS_DAEMON = "mps-daemon-per-lane"
MPS_NAMESPACE = "mps-namespace"
DECLARED_ONLY = "declared-only"
DMEM = "dmem"


class EnforcementError(RuntimeError):
    """The node cannot enforce what the agent was asked to; the message says why and what to do."""


def mechanisms(
    mps: bool,
    layout: LaneLayout | None = None,
    *,
    exclusive_process: bool = False,
    dmem: bool = False,
) -> dict[str, str]:
    """Limit → the mechanism that enforces it; with `dmem`, memory is also held by the kernel (cgroup dmem on
    each lane's pod cgroup)."""
    v3 = mps and layout is not None and layout.generation == "v3"
    limit = (MPS_NAMESPACE if v3 else MPS_DAEMON) if mps else DECLARED_ONLY
    shared = v3 and layout is not None and layout.sharing == "gpu"
    return {
        "memory": (f"{DMEM}+{limit}" if mps else DMEM) if dmem else limit,
        "compute": limit,
        # each lane's own pipe (or namespace) directory and /dev/shm; with servers shared per GPU set, the
        # lane's namespace directory and its server's /dev/shm
        "isolation": "namespace-directories" if shared else "lane-directories",
        # DeviceSpecs / CDI deviceNodes of the lane's GPUs; EXCLUSIVE_PROCESS where one daemon serves a GPU
        "devices": "device-nodes+exclusive-process" if exclusive_process else "device-nodes",
    }


def mps_generation(binary: str, cfg: AgentConfig) -> Generation:
    """The MPS interface the agent will use: what was asked, checked against what the driver offers."""
    offered = mps_v3.detect(binary)
    wanted = offered if cfg.mps_protocol == "auto" else cfg.mps_protocol
    if wanted == "v3" and offered != "v3":
        raise EnforcementError(
            f"--mps-protocol v3 asked, but {binary} offers no MPS v3 namespaces (`{binary} -p 3 -h` lists no "
            "server and namespace modules; they need driver r615 or later): use --mps-protocol legacy or auto"
        )
    if cfg.mps_server_sharing == "gpu" and wanted != "v3":
        raise EnforcementError(
            f"--mps-server-sharing gpu needs MPS v3 namespaces, and {binary} offers none (driver r615 or later); "
            "use --mps-server-sharing lane"
        )
    if wanted == "v3" and (n := mps_v3.socket_path_bytes(str(cfg.mps_root))) > 107:
        raise EnforcementError(
            f"MPS v3 socket paths under {cfg.mps_root} would be {n} bytes, over the kernel's limit of 107 for a "
            "unix socket: choose a shorter --mps-root (chart agent.mpsRoot), or --mps-protocol legacy"
        )
    log.info("MPS interface: %s (the driver offers %s)", wanted, offered)
    return wanted


def check_mps_binary(binary: str) -> None:
    """Refuse to start when the MPS control binary is not there: every lane would be refused at Allocate."""
    found = shutil.which(binary) if os.sep not in binary else (binary if os.access(binary, os.X_OK) else None)
    if found is None:
        raise EnforcementError(
            f"{binary} not found: lanes' limits cannot be enforced with MPS on this node. Install the NVIDIA "
            "driver utilities (the NVIDIA container runtime mounts them with NVIDIA_DRIVER_CAPABILITIES "
            "compute,utility), pass --mps-binary, or run with limits declared only (--no-mps --declared-only; "
            "chart agent.enforcement: declaredOnly)"
        )


def check_dmem(
    mode: Literal["auto", "required", "off"],
    gpus: Sequence[GpuDevice],
    fs_root: Path | None = None,
    mountinfo: Path = MOUNTINFO,
) -> DmemNode | None:
    """dmem as the node offers it for `gpus`, or None (off, or auto where it is not offered: logged); with
    `required`, a refusal to start that says what is missing."""
    if mode == "off":
        return None
    try:
        node = detect(gpus, fs_root, mountinfo)
    except DmemUnavailable as err:
        if mode == "required":
            raise EnforcementError(f"--dmem required: {err}. {FIX}") from None
        log.info("GPU memory not held by cgroup dmem on this node: %s", err)
        return None
    log.info(
        "cgroup dmem on %s: %s",
        node.root,
        ", ".join(f"{uuid} {region}" for uuid, region in sorted(node.regions.items())),
    )
    return node


def report(node: str, by_limit: Mapping[str, str], metrics: AgentMetrics) -> None:
    gauge = metrics.gauge("tessera_agent_lane_enforcement")
    for limit, mechanism in by_limit.items():
        gauge.labels(node=node, limit=limit, mechanism=mechanism).set(1)
    how = ", ".join(f"{k}: {v}" for k, v in by_limit.items())
    if DECLARED_ONLY in by_limit.values():
        log.warning("lane limits are declared only, not enforced (%s)", how)
    else:
        log.info("lane enforcement: %s", how)
