"""Node agent settings, with the contract's defaults (paths, resource name, slots per GPU)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tessera.api import contract


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    resource_name: str = contract.RESOURCE_GPU
    slots_per_gpu: int = contract.DEFAULT_SLOTS_PER_GPU
    device_plugin_dir: Path = Path(contract.DEVICE_PLUGIN_DIR)
    socket_name: str = contract.AGENT_SOCKET_NAME
    kubelet_socket_name: str = "kubelet.sock"
    mps_root: Path = Path(contract.MPS_ROOT)  # host path holding pipe/, log/ and shm/
    mps_container_root: str = contract.MPS_CONTAINER_ROOT
    # How CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names devices: container-visible ordinals (0..n-1, what NVIDIA's
    # plugin uses for its daemon limits after limits by UUID were not applied) or the GPU UUIDs.
    mem_limit_key: Literal["ordinal", "uuid"] = "ordinal"
    coordinator_socket: Path | None = None  # host path of the lane coordinator; None = not offered
    coordinator_container_dir: str = "/run/tessera/coordinator"
    progress_socket: Path | None = None  # host path of the progress endpoint; None = not offered
    progress_container_dir: str = "/run/tessera/progress"
    # Node sockets (coordinator, progress): mode 0660 owned by this group, which workload pods are given as a
    # supplemental group; None keeps the agent's own group (root), reachable by root-run workloads only.
    socket_group: int | None = None
    peer_check: bool = True  # map each socket connection to its pod; off only for demos without pods
    proc_root: Path = Path(
        "/proc"
    )  # where peers' /proc/<pid>/cgroup is read (hostPID); tests use a fake tree
    extra_reserve_mib: int = 0  # margin kept off every GPU's usable memory beyond the driver reserve
    restart_poll_s: float = 1.0  # how often to look for a kubelet restart (§1.4)
    # HP/BE lanes (lanes.py): class-specific MPS env and per-GPU admission at Allocate; off = every lane
    # gets its assigned share with no client priority, as before.
    hp_be_lanes: bool = False
    hp_priority_classes: tuple[str, ...] = (contract.CLASS_LATENCY_CRITICAL,)
    be_percent: int = 50  # BE active-thread percentage until the feedback loop moves it
    # The BE feedback loop (interference.py): needs hp_be_lanes and the progress socket (its latency signal);
    # it deletes BE pods that checkpoint, so the agent's RBAC must allow pods delete and events create.
    be_feedback: bool = False
    be_epsilon: float = 0.15  # target: HP p99 <= (1 + epsilon) x its p99 alone
    be_min_interval_s: float = 300.0  # between two changes on a GPU, and two deletions of a pod
    be_hysteresis: int = 5  # percentage points a change must exceed
    be_step_interval_s: float = 30.0  # how often the loop looks at the HP p99

    def __post_init__(self) -> None:
        self._check_lanes()
        if not self.node_name:
            raise ValueError("the node name is required (set NODE_NAME from the downward API or pass --node)")
        if self.slots_per_gpu < 1:
            raise ValueError(f"slots per GPU must be at least 1, got {self.slots_per_gpu}")
        if self.socket_group is not None and not 0 <= self.socket_group < 2**32 - 1:
            raise ValueError(f"socket group must be a group id in [0, 2^32-2], got {self.socket_group}")
        if self.extra_reserve_mib < 0:
            raise ValueError("extra reserve must not be negative")

    def _check_lanes(self) -> None:
        if not 1 <= self.be_percent <= 100:
            raise ValueError(f"BE percentage must be in 1..100, got {self.be_percent}")
        if self.be_feedback and not self.hp_be_lanes:
            raise ValueError("the BE feedback loop needs HP/BE lanes (--hp-be-lanes)")
        if self.be_feedback and self.progress_socket is None:
            raise ValueError("the BE feedback loop reads HP iteration times from the progress socket")
        if not 0 < self.be_epsilon < 10:
            raise ValueError(f"BE epsilon must be in (0, 10), got {self.be_epsilon}")
        if not self.be_min_interval_s >= 0 or not self.be_step_interval_s > 0:
            raise ValueError("BE minimum interval must be >= 0 and the step interval > 0 seconds")
        if self.be_hysteresis < 0:
            raise ValueError(f"BE hysteresis must be >= 0 points, got {self.be_hysteresis}")

    @property
    def plugin_socket(self) -> Path:
        return self.device_plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / self.kubelet_socket_name

    @property
    def mps_pipe_dir(self) -> Path:
        return self.mps_root / "pipe"

    @property
    def mps_log_dir(self) -> Path:
        return self.mps_root / "log"
