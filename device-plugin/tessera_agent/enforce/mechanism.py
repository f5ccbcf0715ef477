"""Which mechanism enforces each lane limit on this node, said at start in the log and the metrics, and a
refusal to start where the limits asked for could not be enforced (docs/node-agent.md, "What a tenant can
and cannot do")."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping

from tessera_agent.metrics_factory import AgentMetrics

log = logging.getLogger(__name__)

MPS_DAEMON = "mps-daemon-per-lane"
DECLARED_ONLY = "declared-only"


class EnforcementError(RuntimeError):
    """The node cannot enforce what the agent was asked to; the message says why and what to do."""


def mechanisms(mps: bool) -> dict[str, str]:
    """Limit → the mechanism that enforces it."""
    limit = MPS_DAEMON if mps else DECLARED_ONLY
    return {
        "memory": limit,
        "compute": limit,
        "isolation": "lane-directories",  # each lane's own pipe directory and /dev/shm, in both cases
        "devices": "device-nodes",  # DeviceSpecs / CDI deviceNodes of the lane's GPUs
    }


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


def report(node: str, by_limit: Mapping[str, str], metrics: AgentMetrics) -> None:
    gauge = metrics.gauge("tessera_agent_lane_enforcement")
    for limit, mechanism in by_limit.items():
        gauge.labels(node=node, limit=limit, mechanism=mechanism).set(1)
    how = ", ".join(f"{k}: {v}" for k, v in by_limit.items())
    if DECLARED_ONLY in by_limit.values():
        log.warning("lane limits are declared only, not enforced (%s)", how)
    else:
        log.info("lane enforcement: %s", how)
