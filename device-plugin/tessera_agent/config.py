"""Node agent settings, with the contract's defaults (paths, resource name, slots per GPU).

`AgentConfig` is what the agent's parts run with; `AgentSettings` is everything `tessera-agent` is told (the
config plus the process's own options). Both are pydantic models: unknown fields are refused, numbers are
finite and bounded, and an error names its field path (`agent.be_percent`), as the CRDs' errors do;
`field_errors` turns pydantic's errors into (field path, message) pairs (for the files the agent reads too).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError
from tessera.api import contract
from tessera.api.base import MAX_MIB, MAX_SECONDS
from tessera.policy.lanes.iteration import Policy

from tessera_agent.enforce import mps_v3
from tessera_agent.enforce.lane_dirs import LaneLayout, Sharing

MAX_SLOTS_PER_GPU = 48  # MPS serves at most 48 clients per GPU (Volta and later); the chart's bound too
MAX_FAKE_GPUS = 256  # far past any node; a demo's fake GPUs are built and sampled one by one
MAX_GID = 2**32 - 2  # gid_t is 32 bits and (gid_t)-1 means "no change" to chown
SUN_PATH_MAX = 107  # bytes of a unix socket path: sockaddr_un.sun_path holds 108, the last a NUL


def _fail(message: str, field: str = "") -> PydanticCustomError:
    """An error in the CRDs' form: `message` as is, pointing at `field` (a path relative to the model)."""
    return PydanticCustomError(
        "cross_field", message, {"message": message, "field_path": f".{field}" if field else ""}
    )


def _socket_path(path: Path, field: str = "") -> Path:
    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:
        raise _fail(f"a unix socket path must be at most {SUN_PATH_MAX} bytes, {path} has {size}", field)
    return path


SocketPath = Annotated[Path, AfterValidator(_socket_path)]

_AUDIT = (
    "the lane audit (device-plugin mode) checks the device IDs the kubelet lists for each container against "
    "Allocate's; with DRA lanes the kubelet hands a container only its pod's claims' CDI devices, so no audit runs"
)
# What only the device-plugin path reads: given with DRA lanes, refused with the reason rather than ignored
# (a field left at its default is not given; the CLI passes these only when they are set).
DEVICE_PLUGIN_ONLY: dict[str, str] = {
    "device_plugin_dir": "DRA lanes serve no device-plugin socket (their sockets are under --kubelet-plugins-dir)",
    "hp_priority_classes": "with DRA lanes a lane's class is its claim's LaneConfig, never its pod's priority class "
    '(docs/dra.md, "HP and BE lanes")',
    "lane_audit": _AUDIT,
    "pod_resources_socket": _AUDIT,
    "lane_audit_interval_s": _AUDIT,
    "on_lane_mismatch": _AUDIT,
}
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AgentConfig(_Settings):
    node_name: str
    resource_name: str = contract.RESOURCE_GPU
    slots_per_gpu: int = Field(contract.DEFAULT_SLOTS_PER_GPU, ge=1, le=MAX_SLOTS_PER_GPU)
    device_plugin_dir: Path = Path(contract.DEVICE_PLUGIN_DIR)
    socket_name: str = Field(contract.AGENT_SOCKET_NAME, min_length=1)
    kubelet_socket_name: str = Field("kubelet.sock", min_length=1)
    mps_root: Path = Path(contract.MPS_ROOT)  # host path holding lanes/<uid>/{pipe,log,shm}
    # Host directory of the driver's device nodes given to containers (/dev/nvidiaN, nvidiactl, nvidia-uvm*);
    # another directory only for fake device nodes on a node without GPUs.
    dev_root: Path = Path("/dev")
    mps_container_root: str = contract.MPS_CONTAINER_ROOT
    # Which MPS interface enforces lanes (docs/node-agent.md): legacy, a control daemon per lane holding its
    # limits as defaults; v3 (driver r615+), a namespace per lane, its container given only the namespace's
    # socket directory; auto: v3 where `nvidia-cuda-mps-control -p 3 -h` lists namespaces (decided at start).
    mps_protocol: Literal["auto", "legacy", "v3"] = "auto"
    # v3 only: a daemon and server per lane (nothing shared), or per GPU set (its lanes' kernels run
    # concurrently; the server and its clients share one /dev/shm, MPS's transport).
    mps_server_sharing: Sharing = "lane"
    # EXCLUSIVE_PROCESS on a GPU that one MPS daemon serves (enforce/compute_mode.py), so no process can use it
    # past MPS; off leaves compute modes as the admin set them.
    exclusive_process: bool = True
    # How CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names devices: container-visible ordinals (0..n-1, what NVIDIA's
    # plugin uses for its daemon limits after limits by UUID were not applied) or the GPU UUIDs.
    mem_limit_key: Literal["ordinal", "uuid"] = "ordinal"
    coordinator_socket: SocketPath | None = None  # host path of the lane coordinator; None = not offered
    coordinator_container_dir: str = "/run/tessera/coordinator"
    progress_socket: SocketPath | None = None  # host path of the progress endpoint; None = not offered
    progress_container_dir: str = "/run/tessera/progress"
    # Node sockets (coordinator, progress): mode 0660 owned by this group, which workload pods are given as a
    # supplemental group; None keeps the agent's own group (root), reachable by root-run workloads only.
    socket_group: int | None = Field(None, ge=0, le=MAX_GID)
    peer_check: bool = True  # map each socket connection to its pod; off only for demos without pods
    proc_root: Path = Path(
        "/proc"
    )  # where peers' /proc/<pid>/cgroup is read (hostPID); tests use a fake tree
    # GPU memory held by the kernel too (enforce/dmem.py): each lane's memory as dmem.max (and dmem.min, with
    # dmem_guarantee) on its pod's cgroup. auto: where the kernel and driver offer it; required: the agent
    # refuses to start where they do not; off: never.
    dmem: Literal["auto", "required", "off"] = "auto"
    dmem_guarantee: bool = True
    # The host's /sys/fs/cgroup as mounted for the agent (the cgroup v2 root, or on a hybrid host the
    # directory holding unified/); None: the cgroup2 mount in /proc/self/mountinfo.
    cgroup_root: Path | None = None
    # margin kept off every GPU's usable memory beyond the driver reserve
    extra_reserve_mib: int = Field(0, ge=0, le=MAX_MIB)
    restart_poll_s: Seconds = 1.0  # how often to look for a kubelet restart (§1.4)
    # How lanes reach pods: the device plugin (extended resources + the scheduler extender) or DRA (a
    # ResourceSlice with consumable capacity and the kubelet's DRA plugin API; docs/dra.md). auto: DRA when the
    # API server keeps consumable capacity (kubelet/dra_auto.py, decided at start), else the device plugin.
    lanes_api: Literal["devicePlugin", "dra", "auto"] = "devicePlugin"
    # The kubelet's plugin directories (under its --root-dir) and the CDI spec directory containerd reads.
    kubelet_plugins_dir: Path = Path(contract.KUBELET_PLUGINS_DIR)
    kubelet_registry_dir: Path = Path(contract.KUBELET_PLUGINS_REGISTRY_DIR)
    cdi_dir: Path = Path(contract.CDI_DIR)
    # The effect of the device taint an unhealthy GPU gets in the ResourceSlice (docs/dra.md, "Health"):
    # NoSchedule keeps new claims off it; NoExecute also evicts the pods of claims already on it.
    dra_unhealthy_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    # Keep this GPU node for tessera-scheduler's pods (reserve.py): taint the Node when on, remove the taint
    # when off (chart value gpuNodes.reserve).
    reserve_node: bool = False
    # HP/BE lanes (lanes.py): class-specific MPS env and per-GPU admission at Allocate; off = every lane
    # gets its assigned share with no client priority, as before.
    hp_be_lanes: bool = False
    hp_priority_classes: tuple[Annotated[str, Field(min_length=1)], ...] = Field(
        (contract.CLASS_LATENCY_CRITICAL,), min_length=1
    )
    be_percent: int = Field(50, ge=1, le=100)  # BE active-thread percentage until the feedback loop moves it
    # The BE feedback loop (interference.py): needs hp_be_lanes and the progress socket (its latency signal);
    # it deletes BE pods that checkpoint, so the agent's RBAC must allow pods delete and events create.
    be_feedback: bool = False
    be_epsilon: float = Field(0.15, gt=0, lt=10)  # target: HP p99 <= (1 + epsilon) x its p99 alone
    be_min_interval_s: float = Field(
        300.0, ge=0, le=MAX_SECONDS
    )  # between two changes on a GPU, two deletions
    be_hysteresis: int = Field(5, ge=0, le=100)  # percentage points a change must exceed
    be_step_interval_s: Seconds = 30.0  # how often the loop looks at the HP p99
    # The lane audit (lane_audit.py): each container holding our slots checked against its pod's lane through
    # the kubelet's PodResources API; a pod on another pod's lane is deleted (or only reported).
    lane_audit: bool = True
    pod_resources_socket: SocketPath = Path(contract.POD_RESOURCES_SOCKET)
    lane_audit_interval_s: Seconds = 10.0
    on_lane_mismatch: Literal["delete", "report"] = "delete"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.node_name:
            raise _fail(
                "the node name is required (set NODE_NAME from the downward API or pass --node)", "node_name"
            )
        if self.mps_server_sharing == "gpu" and self.mps_protocol == "legacy":
            raise _fail(
                "servers shared per GPU need MPS v3 namespaces: legacy clients reach their daemon's control "
                "socket, which would be shared across tenants (use --mps-protocol v3 or auto)",
                "mps_server_sharing",
            )
        if self.mps_protocol == "v3" and (n := mps_v3.socket_path_bytes(str(self.mps_root))) > 107:
            raise _fail(
                f"MPS v3 socket paths under this directory would be {n} bytes, over the kernel's limit of 107 "
                "for a unix socket: choose a shorter --mps-root (default /run/tessera/mps)",
                "mps_root",
            )
        if self.be_feedback and not self.hp_be_lanes:
            raise _fail("the BE feedback loop needs HP/BE lanes (--hp-be-lanes)", "be_feedback")
        if self.be_feedback and self.progress_socket is None:
            raise _fail(
                "the BE feedback loop reads HP iteration times from the progress socket", "be_feedback"
            )
        if (
            self.lanes_api == "dra"
        ):  # auto takes options for either path: the one not chosen has no use for its own
            for name in sorted(self.model_fields_set & DEVICE_PLUGIN_ONLY.keys()):
                if name != "lane_audit" or self.lane_audit:  # turning the audit off asks nothing of DRA lanes
                    raise _fail(f"not with DRA lanes: {DEVICE_PLUGIN_ONLY[name]}", name)
        _socket_path(self.plugin_socket, "device_plugin_dir")
        _socket_path(self.dra_socket, "kubelet_plugins_dir")
        _socket_path(self.dra_registration_socket, "kubelet_registry_dir")
        return self

    def lane_layout(self) -> LaneLayout:
        """Where lanes' daemons keep their directories and what their containers mount (an unresolved
        `auto` counts as legacy: the agent resolves it at start, before building any part)."""
        if self.mps_protocol == "v3":
            return LaneLayout(self.mps_root, "v3", self.mps_server_sharing)
        return LaneLayout(self.mps_root)

    @property
    def dra_plugin_dir(self) -> Path:
        """The DRA driver's own directory: its service socket and its checkpoint."""
        return self.kubelet_plugins_dir / contract.DRA_DRIVER

    @property
    def dra_socket(self) -> Path:
        return self.dra_plugin_dir / "dra.sock"

    @property
    def dra_registration_socket(self) -> Path:
        return self.kubelet_registry_dir / f"{contract.DRA_DRIVER}-reg.sock"

    @property
    def plugin_socket(self) -> Path:
        return self.device_plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / self.kubelet_socket_name


class AgentSettings(_Settings):
    """Everything `tessera-agent` runs with: the agent's config and the process's own options."""

    agent: AgentConfig
    # Run an MPS control daemon per lane, the lane's limits set server-side (enforce/lane_daemons.py); off, a
    # lane's limits are only declared in its env, which needs `declared_only` on a node with real GPUs.
    mps: bool = True
    declared_only: bool = False
    mps_binary: str = Field("nvidia-cuda-mps-control", min_length=1)
    metrics_port: int = Field(9400, ge=0, le=65535)  # 0 = no metrics server
    health_port: int = Field(0, ge=0, le=65535)  # /healthz and /readyz (health.py); 0 = off
    sample_interval_s: Seconds = 10.0
    shutdown_timeout_s: Seconds = 10.0  # for in-flight work after SIGTERM
    lane_policy: Policy = "FAIR"
    fake_gpus: int = Field(0, ge=0, le=MAX_FAKE_GPUS)  # > 0: fake GPUs and no Kubernetes API
    fake_pods: Path | None = None  # with fake GPUs: a JSON list of pod manifests
    # > 0: that many fake GPUs behind the NVML backend's interface, everything else real (the Kubernetes API,
    # the kubelet's device-plugin calls, the node sockets): for testing a cluster without GPUs
    fake_gpu_backend: int = Field(0, ge=0, le=MAX_FAKE_GPUS)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.agent.be_feedback and self.fake_gpus:
            raise _fail(
                "the BE feedback loop deletes pods through the Kubernetes API; fake GPUs have none",
                "fake_gpus",
            )
        if not self.mps and self.agent.mps_protocol == "v3":
            raise _fail(
                "MPS v3 namespaces need MPS (drop --no-mps or --mps-protocol v3)", "agent.mps_protocol"
            )
        if not self.mps and self.agent.mps_server_sharing == "gpu":
            raise _fail("servers shared per GPU need MPS (drop --no-mps)", "agent.mps_server_sharing")
        if self.fake_pods is not None and not self.fake_gpus:
            raise _fail("fake pods need fake GPUs", "fake_pods")
        if self.agent.lanes_api != "devicePlugin" and self.fake_gpus:
            raise _fail(
                "DRA lanes read claims from the Kubernetes API; --fake-gpus runs without one "
                "(use --fake-gpu-backend)",
                "fake_gpus",
            )
        if self.agent.reserve_node and self.fake_gpus:
            raise _fail(
                "--reserve-node taints the Node through the Kubernetes API; --fake-gpus runs without one "
                "(use --fake-gpu-backend)",
                "fake_gpus",
            )
        if not self.mps and not self.declared_only and not (self.fake_gpus or self.fake_gpu_backend):
            raise _fail(
                "without MPS nothing enforces a lane's memory and compute limits, only its env declares "
                "them (which the workload can change); run with MPS, or pass --declared-only "
                "(chart: agent.enforcement: declaredOnly) to run with limits declared only",
                "mps",
            )
        if self.fake_gpu_backend and self.fake_gpus:
            raise _fail(
                "--fake-gpus runs without a Kubernetes API, --fake-gpu-backend with one: choose one",
                "fake_gpu_backend",
            )
        return self
