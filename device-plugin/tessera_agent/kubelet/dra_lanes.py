"""From an allocated ResourceClaim to the lane a container runs in: the CDI spec NodePrepareResources writes.

The kubelet names only the claim (namespace, name, UID); its allocation (which devices of this node's pool,
what share of each one's capacity) is in the claim's status, read from the API server. Every result the claim
got from this driver becomes one CDI device `gpu.tessera.io/lane=<claim UID>-<device>` (`…-<shareID>` after
it for a device the claim has several shares of), and each carries the env of the whole claim: a container that names only one of the claim's requests still sees all its GPUs in
CUDA_VISIBLE_DEVICES, and the same env and mounts injected twice are applied once (CDI replaces an env
variable or a mount at the same container path).

The env is the device-plugin path's (`allocate.container_allocation`): the claim's GPUs, its own MPS pipe, the
active thread percentage (the smallest compute share the claim got on any of its GPUs, since one process has
one percentage), the pinned memory limit per GPU, `TESSERA_LANE_ID` (the claim's UID), the lane coordinator's
socket (`TESSERA_COORDINATOR_SOCKET`, its directory mounted) and the progress endpoint of the pod the claim is
reserved for.

A claim is one lane per GPU. Several results of one claim on the same GPU (two requests, or one request of
count 2, each a share with its own shareID: KEP-5075 lets one claim take several shares of a device) are
charged separately by the allocator, and the lane gets their sum: memory added up, compute added up (at most
100). Each share keeps its own CDI device and its own entry in the kubelet's answer.

A result with `adminAccess` (KEP-4381 admin access, DRAAdminAccess) is an observer: the allocator does not
count it against the device, so neither does the driver. Its container sees the GPU (visible devices and the
device nodes) and nothing else: no lane, no limits, no MPS pipe.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from kubernetes.utils.quantity import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tessera.api import contract
from tessera.api.resources import input_errors

from tessera_agent.config import AgentConfig
from tessera_agent.enforce.device_nodes import DeviceNode
from tessera_agent.enforce.lane_daemons import LaneLimits
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.kubelet.allocate import ENV_NVIDIA_VISIBLE_DEVICES, progress_endpoint
from tessera_agent.kubelet.dra_slice import device_name
from tessera_agent.lanes.book import LaneClass

CDI_VERSION = "0.6.0"  # env and mounts need 0.3.0; containerd 2.x reads up to 1.1.0


class ClaimError(RuntimeError):
    """A claim this node cannot prepare; the message goes back to the kubelet (and onto the pod's events)."""


class _Loose(BaseModel):
    # the API server's objects carry far more than the driver reads
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class DeviceResult(_Loose):
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = Field(None, alias="shareID")
    consumed_capacity: dict[str, str | int] = Field(default_factory=dict, alias="consumedCapacity")
    admin_access: bool | None = Field(None, alias="adminAccess")


class OpaqueConfig(_Loose):
    driver: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class DeviceConfig(_Loose):
    """One entry of status.allocation.devices.config: the claim's (or its class's) configuration, copied
    there by the allocator, for some requests or (no requests) all."""

    source: str = ""
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueConfig | None = None


class _DeviceAllocation(_Loose):
    results: list[DeviceResult] = Field(default_factory=list)
    config: list[DeviceConfig] = Field(default_factory=list)


class _Allocation(_Loose):
    devices: _DeviceAllocation = Field(default_factory=_DeviceAllocation)


class Consumer(_Loose):
    resource: str = ""
    name: str = ""
    uid: str = ""


class _Status(_Loose):
    allocation: _Allocation | None = None
    reserved_for: list[Consumer] = Field(default_factory=list, alias="reservedFor")


class _Meta(_Loose):
    name: str
    namespace: str = "default"
    uid: str


class ResourceClaim(_Loose):
    metadata: _Meta
    status: _Status = Field(default_factory=_Status)


class LaneDevice(BaseModel):
    """One result of a claim on this node: a device and the share of it the claim got (none for an observer,
    a result with admin access)."""

    model_config = ConfigDict(frozen=True)

    request: str
    device: str
    uuid: str
    memory_mib: int
    compute_percent: int
    share_id: str | None = None
    observer: bool = False


def _quantity(value: str | int) -> Decimal:
    parsed = parse_quantity(value)  # type: ignore[no-untyped-call]  # the client ships no annotations
    if not isinstance(parsed, Decimal) or not parsed.is_finite() or parsed < 0:
        raise ClaimError(f"{value!r} is not a usable quantity")
    return parsed


def lane_devices(
    claim: ResourceClaim, node: str, gpus: list[GpuDevice], usable_mib: dict[str, int]
) -> list[LaneDevice]:
    """The claim's devices from this driver in this node's pool, in allocation order; ClaimError when the claim
    is not allocated or names a device this node does not have."""
    if claim.status.allocation is None:
        raise ClaimError(f"claim {claim.metadata.namespace}/{claim.metadata.name} is not allocated")
    by_name = {device_name(g): g for g in gpus}
    out = []
    for r in claim.status.allocation.devices.results:
        if r.driver != contract.DRA_DRIVER or r.pool != node:
            continue
        gpu = by_name.get(r.device)
        if gpu is None:
            raise ClaimError(
                f"claim {claim.metadata.uid} was allocated {r.device!r}, which node {node} does not have"
            )
        if r.admin_access:
            # The allocator wrote a consumed capacity for it too, but counts none of it: neither do we.
            out.append(
                LaneDevice(
                    request=r.request,
                    device=r.device,
                    uuid=gpu.uuid,
                    memory_mib=0,
                    compute_percent=0,
                    share_id=r.share_id,
                    observer=True,
                )
            )
            continue
        consumed = r.consumed_capacity
        memory = consumed.get(contract.DRA_CAPACITY_MEMORY)
        compute = consumed.get(contract.DRA_CAPACITY_COMPUTE)
        # No consumed capacity: a whole-device allocation (a scheduler without consumable capacity).
        mib = usable_mib[gpu.uuid] if memory is None else math.ceil(_quantity(memory) / MIB)
        pct = 100 if compute is None else int(_quantity(compute).to_integral_value(rounding="ROUND_CEILING"))
        if not 1 <= pct <= 100 or mib < 1:
            raise ClaimError(f"claim {claim.metadata.uid}: {r.device} got {mib} MiB and {pct} % compute")
        out.append(
            LaneDevice(
                request=r.request,
                device=r.device,
                uuid=gpu.uuid,
                memory_mib=mib,
                compute_percent=pct,
                share_id=r.share_id,
            )
        )
    if not out:
        raise ClaimError(f"claim {claim.metadata.uid} has no {contract.DRA_DRIVER} device on node {node}")
    if any(d.observer for d in out) and not all(d.observer for d in out):
        # An observer's container must not hold a lane's MPS pipe, and a lane's must: one container cannot
        # be both, and the kubelet hands every container of the claim the same CDI edits.
        raise ClaimError(
            f"claim {claim.metadata.uid} mixes admin-access results with ordinary ones on node {node}; "
            "an observer and a lane need two claims"
        )
    by_uuid = {g.uuid: g for g in gpus}
    for uuid, (mib, _) in gpu_shares(out).items():
        if mib > usable_mib[uuid]:
            raise ClaimError(
                f"claim {claim.metadata.uid}: its shares of {device_name(by_uuid[uuid])} add up to {mib} MiB, "
                f"more than the {usable_mib[uuid]} MiB it has usable"
            )
    return out


def gpu_shares(devices: list[LaneDevice]) -> dict[str, tuple[int, int]]:
    """The claim's lane on each of its GPUs (UUID, in allocation order): (memory MiB, compute %) summed over
    the claim's shares of that GPU, compute at most 100. Observers hold no share."""
    out: dict[str, tuple[int, int]] = {}
    for d in devices:
        if d.observer:
            continue
        mib, pct = out.get(d.uuid, (0, 0))
        out[d.uuid] = (mib + d.memory_mib, min(100, pct + d.compute_percent))
    return out


def is_observer(devices: list[LaneDevice]) -> bool:
    """Whether the claim only observes its GPUs (admin access): prepared with no lane."""
    return all(d.observer for d in devices)


LANE_CONFIG_API = f"{contract.DRA_DRIVER}/v1alpha1"


class LaneConfig(BaseModel):
    """The opaque parameters a claim gives this driver: its lane's class (docs/dra.md, "HP and BE lanes")."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["gpu.tessera.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["LaneConfig"]
    lane_class: Literal["latency-critical", "best-effort"] = Field(alias="class")


def claim_lane_class(claim: ResourceClaim) -> LaneClass:
    """HP for a claim whose configuration for this driver says `class: latency-critical`, else BE (as a pod with
    no class is in device-plugin mode); ClaimError for parameters this driver does not read, or two configs
    that disagree."""
    assert claim.status.allocation is not None
    classes = set()
    for c in claim.status.allocation.devices.config:
        if c.opaque is None or c.opaque.driver != contract.DRA_DRIVER:
            continue
        try:
            classes.add(LaneConfig.model_validate(c.opaque.parameters).lane_class)
        except ValidationError as err:
            problems = "; ".join(f"{path or 'parameters'}: {msg}" for path, msg in input_errors(err))
            raise ClaimError(
                f"claim {claim.metadata.uid}: its {contract.DRA_DRIVER} configuration: {problems}"
            ) from None
    if len(classes) > 1:
        raise ClaimError(f"claim {claim.metadata.uid}: its configurations name both lane classes")
    return "HP" if classes == {contract.CLASS_LATENCY_CRITICAL} else "BE"


def lane_limits(devices: list[LaneDevice], class_limits: tuple[int, int] | None = None) -> LaneLimits:
    """What the claim's own MPS daemon holds: each GPU's memory (the sum of the claim's shares of it), the
    smallest of its GPUs' compute shares (one process has one percentage); with HP/BE lanes, the
    (active-thread percentage, client priority) of the claim's class (`LaneBook.class_limits`)."""
    shares = gpu_shares(devices)
    if not shares:
        raise ValueError("an observer claim has no lane limits")
    pct, priority = class_limits if class_limits else (min(p for _, p in shares.values()), None)
    return LaneLimits(
        gpus=tuple(shares),
        memory_mib=tuple(m for m, _ in shares.values()),
        thread_percent=pct,
        client_priority=priority,
    )


def lane_env(
    claim: ResourceClaim, devices: list[LaneDevice], cfg: AgentConfig, limits: LaneLimits | None = None
) -> dict[str, str]:
    uuids = list(dict.fromkeys(d.uuid for d in devices))
    visible = ",".join(uuids)
    if is_observer(devices):
        return {contract.ENV_CUDA_VISIBLE_DEVICES: visible, ENV_NVIDIA_VISIBLE_DEVICES: visible}
    limits = limits or lane_limits(devices)
    keys = [str(i) for i in range(len(uuids))] if cfg.mem_limit_key == "ordinal" else uuids
    memory = dict(zip(limits.gpus, limits.memory_mib, strict=True))
    env = {
        contract.ENV_CUDA_VISIBLE_DEVICES: visible,
        ENV_NVIDIA_VISIBLE_DEVICES: visible,
        contract.ENV_MPS_PIPE_DIRECTORY: f"{cfg.mps_container_root}/pipe",
        contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE: str(limits.thread_percent),
        contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT: ",".join(
            f"{k}={memory[u]}M" for k, u in zip(keys, uuids, strict=True)
        ),
        contract.ENV_LANE_ID: claim.metadata.uid,
    }
    if limits.client_priority is not None:
        env[contract.ENV_MPS_CLIENT_PRIORITY] = str(limits.client_priority)
    if cfg.coordinator_socket is not None:  # as Allocate hands it out: the claim's pods join its lane there
        env[contract.ENV_COORDINATOR_SOCKET] = (
            f"{cfg.coordinator_container_dir}/{cfg.coordinator_socket.name}"
        )
    pods = [c for c in claim.status.reserved_for if c.resource == "pods" and c.name]
    if cfg.progress_socket is not None and len(pods) == 1:
        socket = f"{cfg.progress_container_dir}/{cfg.progress_socket.name}"
        env[contract.ENV_PROGRESS_ENDPOINT] = progress_endpoint(
            socket, claim.metadata.namespace, pods[0].name
        )
    return env


def lane_mounts(claim_uid: str, gpus: list[str], cfg: AgentConfig) -> list[dict[str, Any]]:
    """The claim's own pipe directory (its MPS daemon's, or with v3 its namespace's) and /dev/shm, never one
    another claim uses (but for a v3 server shared per GPU set: its /dev/shm; docs/node-agent.md)."""
    lane = cfg.lane_layout().lane_paths(claim_uid, gpus)
    mounts = [(f"{cfg.mps_container_root}/pipe", lane.pipe), ("/dev/shm", lane.shm)]
    if cfg.coordinator_socket is not None:
        mounts.append((cfg.coordinator_container_dir, cfg.coordinator_socket.parent))
    if cfg.progress_socket is not None:
        mounts.append((cfg.progress_container_dir, cfg.progress_socket.parent))
    return [
        {"hostPath": str(host), "containerPath": path, "options": ["rbind", "rw", "nosuid", "nodev"]}
        for path, host in mounts
    ]


def cdi_device_names(claim_uid: str, devices: list[LaneDevice]) -> list[str]:
    """One CDI device name per result, distinct within the spec (CDI refuses a spec that names a device
    twice): `<claim UID>-<device>`, and for a device the claim has several shares of, the share's ID (or its
    place among them) after it."""
    counts: dict[str, int] = {}
    for d in devices:
        counts[d.device] = counts.get(d.device, 0) + 1
    seen: dict[str, int] = {}
    names = []
    for d in devices:
        seen[d.device] = seen.get(d.device, 0) + 1
        if counts[d.device] == 1:
            names.append(f"{claim_uid}-{d.device}")
        else:
            names.append(f"{claim_uid}-{d.device}-{d.share_id or seen[d.device]}")
    return names


def cdi_device_id(name: str) -> str:
    return f"{contract.DRA_CDI_KIND}={name}"


def cdi_spec(
    claim: ResourceClaim,
    devices: list[LaneDevice],
    cfg: AgentConfig,
    nodes: list[DeviceNode] | None = None,
    limits: LaneLimits | None = None,
) -> dict[str, Any]:
    """The claim's CDI devices; with `nodes` (`enforce.device_nodes.lane_device_nodes` of the claim's GPUs)
    each also carries the device nodes, so plain runc gives the container its GPUs and no other."""
    env = [f"{k}={v}" for k, v in lane_env(claim, devices, cfg, limits).items()]
    edits: dict[str, Any] = {"env": env}
    if not is_observer(devices):
        edits["mounts"] = lane_mounts(claim.metadata.uid, list(gpu_shares(devices)), cfg)
    if nodes:
        edits["deviceNodes"] = [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions} for n in nodes
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": contract.DRA_CDI_KIND,
        "devices": [
            {"name": name, "containerEdits": edits} for name in cdi_device_names(claim.metadata.uid, devices)
        ],
    }


def cdi_spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    # CDI reads every *.json in its directories; one file per claim makes unprepare a single unlink
    return cdi_dir / f"{contract.DRA_DRIVER}-{claim_uid}.json"


def write_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` or what it held before, never a torn file (container runtimes read CDI specs at any
    time, and an agent killed mid-write must find its checkpoint whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_cdi_spec(
    cdi_dir: Path,
    claim: ResourceClaim,
    devices: list[LaneDevice],
    cfg: AgentConfig,
    nodes: list[DeviceNode] | None = None,
    limits: LaneLimits | None = None,
) -> Path:
    path = cdi_spec_path(cdi_dir, claim.metadata.uid)
    write_atomically(path, json.dumps(cdi_spec(claim, devices, cfg, nodes, limits), indent=1).encode())
    return path
