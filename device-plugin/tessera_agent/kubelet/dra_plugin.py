"""The agent as the kubelet's DRA driver `gpu.tessera.io` (kubelet DRA plugin API v1).

  registration  a gRPC `pluginregistration.Registration` server on `<registry dir>/gpu.tessera.io-reg.sock`;
                the kubelet's plugin watcher finds the socket, calls GetInfo (type DRAPlugin, the driver name,
                the DRA socket, the services offered: `v1.DRAPlugin`) and reports back in
                NotifyRegistrationStatus
  DRA service   `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on `<plugins dir>/gpu.tessera.io/dra.sock`:
                NodePrepareResources reads each claim's allocation from the API server, writes a CDI spec with
                the lane's env and mounts (`dra_lanes`) and answers the CDI device IDs;
                NodeUnprepareResources removes the spec
  health        `v1.DRAResourceHealth` on the same socket (KEP-4680): NodeWatchResources streams every GPU's
                health, again on each change and every HEALTH_RESEND_S, which the kubelet shows in the status
                of the pods whose claims hold the GPU (`allocatedResourcesStatus`)
  ResourceSlice the node's GPUs (`dra_slice`), published at start and again on every health change; an
                unhealthy GPU carries the device taint gpu.tessera.io/unhealthy, which a restarted agent
                takes back from its published slice (NVML does not say again what it reported before)

Prepared claims are checkpointed (`<plugins dir>/gpu.tessera.io/checkpoint.json`, written whole or not at
all): a claim is recorded as `preparing` before its CDI spec is written and as `prepared`, with the answer,
after. An agent killed anywhere in between comes back knowing every claim it may have left a spec for: the
kubelet's retry of the prepare finishes it (same claim UID, same file), an unprepare removes its spec, and a
prepare of a claim already prepared answers from the checkpoint without asking the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import grpc  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tessera.api import contract
from tessera.kube import KubeClient, KubeError

from tessera_agent.config import AgentConfig
from tessera_agent.enforce.cgroups import pod_cgroup
from tessera_agent.enforce.device_nodes import DeviceNodeError, lane_device_nodes
from tessera_agent.enforce.dmem import DmemError
from tessera_agent.enforce.dmem_lanes import DmemLanes, PodRef, pods_memory
from tessera_agent.enforce.lane_daemons import LaneDaemons, LaneLimits
from tessera_agent.enforce.mps import MpsError
from tessera_agent.gpus.backend import GpuBackend, usable_memory_mib
from tessera_agent.gpus.telemetry import HeldLane
from tessera_agent.kubelet.dra_lanes import (
    ClaimError,
    LaneDevice,
    ResourceClaim,
    cdi_device_id,
    cdi_device_names,
    cdi_spec_path,
    claim_lane_class,
    is_observer,
    lane_devices,
    lane_limits,
    write_atomically,
    write_cdi_spec,
)
from tessera_agent.kubelet.dra_slice import device_name, resource_slice, slice_name
from tessera_agent.lanes.book import LaneAdmissionError, LaneBook
from tessera_agent.pods import NodePod
from tessera_agent.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

log = logging.getLogger(__name__)

# For tests of an agent killed mid-prepare on a real node: while the file this names exists, every prepare
# stops after recording its claim as `preparing`.
HOLD_PREPARE_ENV = "TESSERA_AGENT_HOLD_PREPARE"

DRA_SERVICE = "v1.DRAPlugin"  # k8s.io/kubelet/pkg/apis/dra/v1 DRAPluginService: what the kubelet picks
HEALTH_SERVICE = "v1.DRAResourceHealth"  # k8s.io/kubelet/pkg/apis/dra-health/v1 DRAResourceHealthService
# The kubelet holds a device's reported health for its timeout, then says Unknown: the stream repeats every
# GPU's health well within it.
HEALTH_RESEND_S = 10.0
HEALTH_TIMEOUT_S = 60
PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go
RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICE_RESYNC_S = 10.0  # how often the published slice is compared with the GPUs


# --- the API server ----------------------------------------------------------------------------------------
class DraApi(Protocol):
    """What the driver reads and writes on the API server."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def node_uid(self, node: str) -> str | None: ...

    async def get_slice(self, name: str) -> dict[str, Any] | None: ...

    async def put_slice(self, body: dict[str, Any], *, create: bool) -> dict[str, Any]: ...


class KubernetesDraApi(DraApi):
    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._api.request("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")

    async def node_uid(self, node: str) -> str | None:
        try:
            got = await self._api.request("GET", f"/api/v1/nodes/{node}")
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        uid = (got.get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    async def get_slice(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._api.request("GET", f"{RESOURCE_API}/resourceslices/{name}")
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def put_slice(self, body: dict[str, Any], *, create: bool) -> dict[str, Any]:
        if create:
            return await self._api.request("POST", f"{RESOURCE_API}/resourceslices", body=body)
        name = body["metadata"]["name"]
        return await self._api.request("PUT", f"{RESOURCE_API}/resourceslices/{name}", body=body)


# --- the checkpoint ----------------------------------------------------------------------------------------
class PreparedDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    share_id: str | None = None


class PreparedClaim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str
    name: str
    state: Literal["preparing", "prepared"]
    devices: list[PreparedDevice] = Field(default_factory=list)
    # UIDs of the pods the claim was reserved for (status.reservedFor), as last read: the pods that hold its
    # lane, which the progress endpoint lets report (they carry no tessera.io/assignment).
    pod_uids: list[str] = Field(default_factory=list)
    # The lane's limits as enforced, per GPU UUID: (memory MiB, active-thread %), for per-lane telemetry.
    limits: dict[str, tuple[int, int]] = Field(default_factory=dict)
    # Admin access only: the GPUs made visible, no lane (nothing in the lane book, no daemon, no limits).
    observer: bool = False


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    claims: dict[str, PreparedClaim] = Field(default_factory=dict)  # by claim UID

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls()
        try:
            return cls.model_validate_json(data)
        except ValidationError as err:
            # Refusing to start would leave every prepared claim stuck; starting empty loses them. Neither
            # is right, so keep the file for a person to read and start empty.
            bad = path.with_suffix(".unreadable")
            path.replace(bad)
            log.error("DRA checkpoint %s unreadable (%s); moved to %s, starting empty", path, err, bad)
            return cls()

    def save(self, path: Path) -> None:
        write_atomically(path, self.model_dump_json(indent=1).encode())


# --- the kubelet's DRA service -----------------------------------------------------------------------------
class DraServicer(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(
        self,
        cfg: AgentConfig,
        backend: GpuBackend,
        api: DraApi,
        daemons: LaneDaemons | None = None,
        lanes: LaneBook | None = None,
        dmem: DmemLanes | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.api = api
        self.dmem = dmem  # lanes' memory on their pods' cgroups, written at prepare (None: off)
        self.lanes = lanes  # HP/BE lanes keyed by claim UID (None: off, every lane gets its allocated share)
        # each claim's directories and MPS daemon, as NVIDIA's DRA driver runs one per claim
        self.daemons = daemons if daemons is not None else LaneDaemons.directories_only(cfg.mps_root)
        self.checkpoint_path = cfg.dra_plugin_dir / "checkpoint.json"
        self.checkpoint = Checkpoint.load(self.checkpoint_path)
        self._lock = asyncio.Lock()  # one checkpoint writer at a time
        # BE claims a new BE share could not reach (claim UID → why): their pods are not restarted for it.
        self.unshared: dict[str, str] = {}
        # Test hook: awaited after a claim is recorded as preparing, before its CDI spec is written.
        self.before_cdi_write: Callable[[str], Awaitable[None]] | None = None
        hold = os.environ.get(HOLD_PREPARE_ENV)
        if hold:
            self.before_cdi_write = _hold_while_exists(Path(hold))

    def _save(self) -> None:
        self.checkpoint.save(self.checkpoint_path)

    async def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: object
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        out = dra_v1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                devices = await self.prepare(claim.namespace, claim.name, claim.uid)
            except ClaimError as err:
                log.warning("claim %s/%s (%s) not prepared: %s", claim.namespace, claim.name, claim.uid, err)
                out.claims[claim.uid].error = str(err)
                continue
            except Exception as err:  # an API hiccup: the kubelet retries the prepare
                log.exception("claim %s/%s (%s) not prepared", claim.namespace, claim.name, claim.uid)
                out.claims[claim.uid].error = f"{type(err).__name__}: {err}"
                continue
            out.claims[claim.uid].devices.extend(
                dra_v1_pb2.Device(
                    request_names=d.request_names,
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_device_ids,
                    **({"share_id": d.share_id} if d.share_id else {}),
                )
                for d in devices
            )
        return out

    async def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: object
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        out = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                await self.unprepare(claim.uid)
                out.claims[claim.uid].error = ""
            except OSError as err:
                log.exception("claim %s/%s (%s) not unprepared", claim.namespace, claim.name, claim.uid)
                out.claims[claim.uid].error = str(err)
        return out

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        async with self._lock:
            known = self.checkpoint.claims.get(uid)
            if known is not None and known.state == "prepared":
                return known.devices
            self.checkpoint.claims[uid] = PreparedClaim(namespace=namespace, name=name, state="preparing")
            self._save()
        if self.before_cdi_write is not None:
            await self.before_cdi_write(uid)
        claim = ResourceClaim.model_validate(await self.api.get_claim(namespace, name))
        if claim.metadata.uid != uid:
            raise ClaimError(
                f"claim {namespace}/{name} has UID {claim.metadata.uid} now, not {uid} (deleted and recreated)"
            )
        gpus = self.backend.gpus()
        usable = {g.uuid: usable_memory_mib(g, self.cfg.extra_reserve_mib) for g in gpus}
        lanes = lane_devices(claim, self.cfg.node_name, gpus, usable)
        by_uuid = {g.uuid: g for g in gpus}
        observer = is_observer(lanes)
        # An observer (admin access) is charged nothing: no lane book entry, no daemon, no limits.
        limits = None if observer else self._admit(claim, lanes)
        seen = list(dict.fromkeys(d.uuid for d in lanes))
        try:
            nodes = lane_device_nodes([by_uuid[u] for u in seen], self.cfg.dev_root)
        except DeviceNodeError as err:
            if self.lanes is not None:
                self.lanes.forget(uid)
            raise ClaimError(f"claim {uid}: {err}") from None
        if limits is not None:
            try:
                await self.daemons.ensure(uid, limits)  # CDI mounts' sources must exist: the lane's dirs too
            except MpsError as err:
                await self.daemons.release(uid)
                if self.lanes is not None:
                    self.lanes.forget(uid)
                raise ClaimError(f"claim {uid}: its lane's MPS daemon did not start: {err}") from None
            try:
                await self._limit_pods(claim, limits)
            except DmemError as err:  # required: the kubelet retries the prepare
                await self.daemons.release(uid)
                if self.lanes is not None:
                    self.lanes.forget(uid)
                raise ClaimError(f"claim {uid}: {err}") from None
        async with self._lock:
            write_cdi_spec(self.cfg.cdi_dir, claim, lanes, self.cfg, nodes, limits)
            devices = [
                PreparedDevice(
                    request_names=[d.request],
                    pool=self.cfg.node_name,
                    device=d.device,
                    cdi_device_ids=[cdi_device_id(cdi_name)],
                    share_id=d.share_id,
                )
                for d, cdi_name in zip(lanes, cdi_device_names(uid, lanes), strict=True)
            ]
            self.checkpoint.claims[uid] = PreparedClaim(
                namespace=namespace,
                name=name,
                state="prepared",
                devices=devices,
                pod_uids=reserved_pod_uids(claim),
                limits={}
                if limits is None
                else {
                    g: (mib, limits.thread_percent)
                    for g, mib in zip(limits.gpus, limits.memory_mib, strict=True)
                },
                observer=observer,
            )
            self._save()
        log.info(
            "prepared claim %s/%s: %s",
            namespace,
            name,
            ", ".join(
                f"{d.device} observed (admin access)"
                if d.observer
                else f"{d.device} {d.memory_mib} MiB {d.compute_percent}%"
                for d in lanes
            ),
        )
        return devices

    async def _limit_pods(self, claim: ResourceClaim, limits: LaneLimits) -> None:
        """The claim's pods whose cgroups the kubelet has made (the one it prepares the claim for) held to
        their lanes' memory, this claim's included; the others are left to the agent's round."""
        if self.dmem is None:
            return
        pods = [c for c in claim.status.reserved_for if c.resource == "pods" and c.uid]
        mine = (dict(zip(limits.gpus, limits.memory_mib, strict=True)), [c.uid for c in pods])
        others = [lane for key, lane in self._claim_lanes().items() if key != claim.metadata.uid]
        wanted = pods_memory([*others, mine])
        ready = [c for c in pods if pod_cgroup(self.dmem.limits.node.root, c.uid) is not None]
        for c in ready or pods[:1]:  # none ready: the first one's failure says why
            ref = PodRef(c.uid, claim.metadata.namespace, c.name)
            await self.dmem.apply(ref, wanted[c.uid], when="NodePrepareResources")

    def _claim_lanes(self) -> dict[str, tuple[dict[str, int], list[str]]]:
        return {
            uid: ({g: mib for g, (mib, _) in c.limits.items()}, list(c.pod_uids))
            for uid, c in self.checkpoint.claims.items()
            if c.state == "prepared" and not c.observer and c.limits
        }

    def claim_lanes(self) -> list[tuple[dict[str, int], list[str]]]:
        """Each prepared claim's lane: (memory MiB per GPU UUID, the UIDs of the pods it is reserved for)."""
        return list(self._claim_lanes().values())

    async def refresh_claim_pods(self) -> None:
        """Each prepared claim's pods read again from its status.reservedFor (a pod that shares a claim after
        its prepare is only there)."""
        for uid, known in list(self.checkpoint.claims.items()):
            if known.state == "prepared" and not known.observer:
                await self._reread_pods(uid, known.namespace, known.name)

    async def _reread_pods(self, uid: str, namespace: str, name: str) -> set[str] | None:
        """The claim's pods read again from its status.reservedFor and kept in the checkpoint; None when it
        cannot be read, or is no longer the claim prepared here (deleted and recreated under its name)."""
        try:
            claim = ResourceClaim.model_validate(await self.api.get_claim(namespace, name))
        except Exception as err:  # gone, or the API server away: the next round reads it again
            log.info("claim %s/%s not re-read for its pods: %s", namespace, name, err)
            return None
        if claim.metadata.uid != uid:
            return None
        pods = reserved_pod_uids(claim)
        async with self._lock:
            current = self.checkpoint.claims.get(uid)
            if current is not None and current.state == "prepared" and current.pod_uids != pods:
                current.pod_uids = pods
                self._save()
        return set(pods)

    def held_lanes(self, pods: Sequence[NodePod]) -> list[HeldLane]:
        """The lanes `pods` hold through the claims prepared here (the lane is the claim's UID), for per-lane
        telemetry; a pod a claim was shared with later shows once the claim's pods are read again."""
        by_uid = {p.uid: p for p in pods}
        out = []
        for uid, c in self.checkpoint.claims.items():
            if c.state != "prepared" or c.observer:
                continue
            for pod_uid in c.pod_uids:
                pod = by_uid.get(pod_uid)
                if pod is not None:
                    out.append(HeldLane(uid, pod.uid, pod.namespace, pod.name, dict(c.limits)))
        return out

    async def holds_lane(self, namespace: str, pod_uid: str) -> bool:
        """Whether a claim prepared on this node is reserved for the pod `pod_uid` of `namespace`."""
        return bool(await self.lanes_held(namespace, pod_uid))

    async def lanes_held(self, namespace: str, pod_uid: str) -> set[str]:
        """The UIDs of the claims prepared on this node that are reserved for the pod `pod_uid` of `namespace`
        (each claim is a lane).

        The kubelet prepares a claim once, for the first of its pods; a pod that shares it later is only in
        the claim's status.reservedFor, so claims of the pod's namespace that do not name it are read again
        (a claim is namespaced: no other namespace's claim can be the pod's)."""
        prepared = {  # an observer's claim is no lane: its pods report no progress and join no lane
            uid: c
            for uid, c in self.checkpoint.claims.items()
            if c.state == "prepared" and c.namespace == namespace and not c.observer
        }
        held = {uid for uid, c in prepared.items() if pod_uid in c.pod_uids}
        if held:
            return held
        for uid, known in prepared.items():
            pods = await self._reread_pods(uid, namespace, known.name)
            if pods is not None and pod_uid in pods:  # an unreadable claim vouches for no one now
                held.add(uid)
        return held

    async def unprepare(self, uid: str) -> None:
        async with self._lock:
            with contextlib.suppress(FileNotFoundError):
                cdi_spec_path(self.cfg.cdi_dir, uid).unlink()
            if self.checkpoint.claims.pop(uid, None) is not None:
                self._save()
                log.info("unprepared claim %s", uid)
        await self.daemons.release(uid)
        self.unshared.pop(uid, None)
        if self.lanes is not None:
            self.lanes.forget(uid)
        if self.dmem is not None:  # its pods' limits now those of the lanes they still hold, or released
            await self.dmem.sync(pods_memory(self.claim_lanes()), {})

    def _admit(self, claim: ResourceClaim, devices: list[LaneDevice]) -> LaneLimits:
        """The claim's limits; with HP/BE lanes, its class from its configuration, admitted in the lane book
        (one HP lane per GPU, lanes' memory within the GPU), or ClaimError with the reason."""
        if self.lanes is None:
            return lane_limits(devices)
        klass = claim_lane_class(claim)
        plain = lane_limits(devices)
        try:
            self.lanes.admit_lane(
                claim.metadata.uid,
                f"claim {claim.metadata.namespace}/{claim.metadata.name}",
                dict(zip(plain.gpus, plain.memory_mib, strict=True)),
                klass,
                plain.thread_percent,
            )
        except LaneAdmissionError as err:
            raise ClaimError(str(err)) from None
        return lane_limits(devices, self.lanes.class_limits(klass, plain.thread_percent, plain.gpus))

    async def apply_be_share(self, gpu: str, percent: int) -> None:
        """The BE feedback loop moved `gpu`'s BE share (the lane book has it): every BE claim prepared on it takes
        the new share where a container or an MPS server starting later reads it, its CDI spec's env and its
        lane's MPS limits (its daemon's defaults, or with v3 its namespace's). A pod that keeps its claim (a standalone ResourceClaim)
        thus restarts with the new share; a claim from a template is replaced by one prepared afresh, which
        gets it at prepare. A claim this fails for is recorded in `unshared` (its pods are then not restarted)."""
        assert self.lanes is not None
        for uid in sorted({ln.uid for ln in self.lanes.on_gpu(gpu) if ln.klass == "BE"}):
            try:
                await self._reshare(uid)
            except Exception as err:  # one claim's trouble must not keep the share from the others
                self.unshared[uid] = (
                    f"{type(err).__name__}: {err}" if not isinstance(err, ClaimError) else str(err)
                )
                log.warning("claim %s keeps its old BE share (GPU %s now %d%%): %s", uid, gpu, percent, err)
            else:
                self.unshared.pop(uid, None)

    async def _reshare(self, uid: str) -> None:
        known = self.checkpoint.claims.get(uid)
        if known is None or known.state != "prepared" or known.observer:
            return
        assert self.lanes is not None
        claim = ResourceClaim.model_validate(await self.api.get_claim(known.namespace, known.name))
        if claim.metadata.uid != uid:
            raise ClaimError(
                f"claim {known.namespace}/{known.name} has UID {claim.metadata.uid} now, not {uid}"
            )
        gpus = self.backend.gpus()
        usable = {g.uuid: usable_memory_mib(g, self.cfg.extra_reserve_mib) for g in gpus}
        lanes = lane_devices(claim, self.cfg.node_name, gpus, usable)
        plain = lane_limits(lanes)
        limits = lane_limits(lanes, self.lanes.class_limits("BE", plain.thread_percent, plain.gpus))
        by_uuid = {g.uuid: g for g in gpus}
        nodes = lane_device_nodes([by_uuid[u] for u in limits.gpus], self.cfg.dev_root)
        await self.daemons.update(uid, limits)
        async with self._lock:
            if self.checkpoint.claims.get(uid) is not known:
                return  # unprepared meanwhile: nothing to write
            write_cdi_spec(self.cfg.cdi_dir, claim, lanes, self.cfg, nodes, limits)
            known.limits = {
                g: (mib, limits.thread_percent) for g, mib in zip(limits.gpus, limits.memory_mib, strict=True)
            }
            known.pod_uids = reserved_pod_uids(claim)
            self._save()
        log.info("claim %s/%s: BE share now %d%%", known.namespace, known.name, limits.thread_percent)

    async def restore_lanes(self) -> None:
        """After a restart: the claims prepared before it back in the lane book (their HP/BE classes and
        memory, so admission stays right) and, with MPS, each one's daemon started again (its containers'
        clients reconnect to it). A claim that cannot be read again keeps its directories until unprepared."""
        if self.lanes is None and not self.daemons.mps:
            return
        for uid, known in list(self.checkpoint.claims.items()):
            if known.state != "prepared" or known.observer:
                continue
            try:
                claim = ResourceClaim.model_validate(await self.api.get_claim(known.namespace, known.name))
                gpus = self.backend.gpus()
                usable = {g.uuid: usable_memory_mib(g, self.cfg.extra_reserve_mib) for g in gpus}
                limits = self._admit(claim, lane_devices(claim, self.cfg.node_name, gpus, usable))
                if self.daemons.mps and self.daemons.running(uid) is None:
                    await self.daemons.ensure(uid, limits)
            except Exception as err:  # one claim's trouble must not stop the others'
                log.warning(
                    "claim %s/%s not restored after the restart: %s", known.namespace, known.name, err
                )


def reserved_pod_uids(claim: ResourceClaim) -> list[str]:
    return [c.uid for c in claim.status.reserved_for if c.resource == "pods" and c.uid]


class HealthServicer(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    """The kubelet's health stream (KEP-4680): every GPU's health as the slice publisher knows it."""

    def __init__(self, cfg: AgentConfig, backend: GpuBackend, slices: SlicePublisher) -> None:
        self.cfg = cfg
        self.backend = backend
        self.slices = slices

    def snapshot(self) -> dra_health_v1_pb2.NodeWatchResourcesResponse:
        now = int(datetime.now(UTC).timestamp())
        out = dra_health_v1_pb2.NodeWatchResourcesResponse()
        for gpu in self.backend.gpus():
            healthy = self.slices.health.get(gpu.uuid, gpu.healthy)
            out.devices.append(
                dra_health_v1_pb2.DeviceHealth(
                    device=dra_health_v1_pb2.DeviceIdentifier(
                        pool_name=self.cfg.node_name, device_name=device_name(gpu)
                    ),
                    health=dra_health_v1_pb2.HEALTHY if healthy else dra_health_v1_pb2.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                    message="" if healthy else self.slices.reasons.get(gpu.uuid, "unhealthy"),
                )
            )
        return out

    async def NodeWatchResources(
        self, request: dra_health_v1_pb2.NodeWatchResourcesRequest, context: object
    ) -> AsyncIterator[dra_health_v1_pb2.NodeWatchResourcesResponse]:
        changed = asyncio.Event()
        self.slices.watchers.add(changed)
        try:
            while True:
                changed.clear()
                yield self.snapshot()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), HEALTH_RESEND_S)
        finally:
            self.slices.watchers.discard(changed)


class RegistrationServicer(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(
        self, request: pluginregistration_v1_pb2.InfoRequest, context: object
    ) -> pluginregistration_v1_pb2.PluginInfo:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=contract.DRA_DRIVER,
            endpoint=str(self.cfg.dra_socket),
            supported_versions=[DRA_SERVICE, HEALTH_SERVICE],
        )

    async def NotifyRegistrationStatus(
        self, request: pluginregistration_v1_pb2.RegistrationStatus, context: object
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", contract.DRA_DRIVER)
            self.registered.set()
        else:
            # a refusal after a yes (a restarted kubelet that refuses the driver) makes the node unready again
            self.registered.clear()
            self.last_error = request.error
            log.error("kubelet refused DRA driver %s: %s", contract.DRA_DRIVER, request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def _hold_while_exists(path: Path) -> Callable[[str], Awaitable[None]]:
    async def hold(uid: str) -> None:
        if path.exists():
            log.warning("holding the prepare of claim %s while %s exists (%s)", uid, path, HOLD_PREPARE_ENV)
        while path.exists():
            await asyncio.sleep(0.1)

    return hold


# --- the ResourceSlice -------------------------------------------------------------------------------------
class SlicePublisher:
    """Keeps the node's ResourceSlice equal to its GPUs; the pool generation rises with every change.

    An unhealthy GPU's taint outlives the agent: NVML reports an XID once, so the first publish after a start
    takes the GPUs the published slice has tainted as unhealthy, unless the taint was added before the node
    booted (a reboot resets the GPUs; a GPU still failing reports again) or a health event already spoke of
    the GPU since the start. NVML reports no recovery either: a taint removed from the slice by hand makes
    the GPU healthy again."""

    def __init__(
        self, cfg: AgentConfig, backend: GpuBackend, api: DraApi, *, boot_time: datetime | None = None
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.api = api
        self.health = {g.uuid: g.healthy for g in backend.gpus()}
        self.boot_time = boot_time if boot_time is not None else node_boot_time()
        self._adopted = False
        self._heard: set[str] = set()  # GPUs a health event spoke of since the start
        self._tainted: set[str] = set()  # GPUs the last publish tainted
        self._lock = asyncio.Lock()
        self.reasons: dict[str, str] = {}  # why each unhealthy GPU is, for the kubelet's health stream
        self.watchers: set[asyncio.Event] = set()  # one per health stream, set on every health change

    async def publish(self) -> dict[str, Any]:
        # One at a time (the resync and a health change may meet): a slice read before another publish's write
        # would look like a taint removed by hand.
        async with self._lock:
            return await self._publish()

    async def _publish(self) -> dict[str, Any]:
        name = slice_name(self.cfg.node_name)
        current = await self.api.get_slice(name)
        if not self._adopted:
            self._adopt_taints(current)
            self._adopted = True
        else:
            self._cleared_by_hand(current)
        generation = int(((current or {}).get("spec") or {}).get("pool", {}).get("generation", 0))
        want = resource_slice(
            self.cfg.node_name,
            self.backend,
            slots=self.cfg.slots_per_gpu,
            generation=generation,
            extra_reserve_mib=self.cfg.extra_reserve_mib,
            health=self.health,
            node_uid=await self.api.node_uid(self.cfg.node_name),
            taint_effect=self.cfg.dra_unhealthy_effect,
        )
        _keep_time_added(current, want)
        if current is not None and _same_devices(current, want):
            self._tainted = _tainted_uuids(want)
            return current
        if current is None:
            published = await self.api.put_slice(want, create=True)
        else:
            want["spec"]["pool"]["generation"] = generation + 1
            want["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            published = await self.api.put_slice(want, create=False)
        self._tainted = _tainted_uuids(want)  # only once written: a failed put taints nothing
        log.info("published ResourceSlice %s (generation %d)", name, want["spec"]["pool"]["generation"])
        return published

    def set_health(self, uuid: str, healthy: bool, reason: str = "") -> bool:
        """Whether this changed anything (then publish again)."""
        self._heard.add(uuid)
        if uuid not in self.health or self.health[uuid] == healthy:
            return False
        self.health[uuid] = healthy
        self._set_reason(uuid, healthy, reason)
        return True

    def _set_reason(self, uuid: str, healthy: bool, reason: str) -> None:
        if healthy:
            self.reasons.pop(uuid, None)
        else:
            self.reasons[uuid] = reason
        for changed in self.watchers:
            changed.set()

    def _cleared_by_hand(self, current: dict[str, Any] | None) -> None:
        """A taint this agent published and someone removed from the slice since: a person saying the GPU is
        repaired (NVML reports no recovery). A slice gone as a whole says nothing (the kubelet removes the
        slices of a driver it has not heard from for a while)."""
        if current is None:
            return
        for uuid in self._tainted - _tainted_uuids(current):
            if not self.health.get(uuid, True):
                log.warning(
                    "GPU %s: taint %s removed from the slice; healthy again",
                    uuid,
                    contract.DRA_TAINT_UNHEALTHY,
                )
                self.health[uuid] = True
                self._set_reason(uuid, True, "")

    def _adopt_taints(self, current: dict[str, Any] | None) -> None:
        for dev in ((current or {}).get("spec") or {}).get("devices") or []:
            uuid = ((dev.get("attributes") or {}).get(contract.DRA_ATTRIBUTE_UUID) or {}).get("string")
            if uuid not in self.health or uuid in self._heard or not self.health[uuid]:
                continue
            for taint in dev.get("taints") or []:
                if taint.get("key") != contract.DRA_TAINT_UNHEALTHY:
                    continue
                added = _timestamp(taint.get("timeAdded"))
                if added is not None and self.boot_time is not None and added < self.boot_time:
                    log.info("GPU %s: taint %s predates the node's boot; dropped", uuid, taint["key"])
                    continue
                log.warning("GPU %s stays unhealthy: its slice device is tainted %s", uuid, taint["key"])
                self.health[uuid] = False
                self._set_reason(uuid, False, f"tainted {taint['key']} before the agent's restart")


def _tainted_uuids(body: dict[str, Any]) -> set[str]:
    """The GPUs (by UUID) a slice taints unhealthy."""
    out = set()
    for dev in (body.get("spec") or {}).get("devices") or []:
        uuid = ((dev.get("attributes") or {}).get(contract.DRA_ATTRIBUTE_UUID) or {}).get("string")
        if uuid and any(t.get("key") == contract.DRA_TAINT_UNHEALTHY for t in dev.get("taints") or []):
            out.add(str(uuid))
    return out


def node_boot_time(proc: Path = Path("/proc")) -> datetime | None:
    """When the node booted (`btime` of /proc/stat, the host's in any container); None when unreadable."""
    try:
        for line in (proc / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), UTC)
    except (OSError, ValueError):
        pass
    return None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _keep_time_added(current: dict[str, Any] | None, want: dict[str, Any]) -> None:
    """Each taint still there keeps the timeAdded the API server gave it (a taint sent without one is new to
    the API server, and eviction's tolerationSeconds count from it)."""
    published = {d.get("name"): d for d in ((current or {}).get("spec") or {}).get("devices") or []}
    for dev in want["spec"]["devices"]:
        had = {
            (t.get("key"), t.get("effect")): t for t in (published.get(dev["name"]) or {}).get("taints") or []
        }
        for taint in dev.get("taints") or []:
            old = had.get((taint["key"], taint["effect"]))
            if old is not None and old.get("timeAdded"):
                taint["timeAdded"] = old["timeAdded"]


def _same_devices(current: dict[str, Any], want: dict[str, Any]) -> bool:
    spec = current.get("spec") or {}
    return bool(
        spec.get("devices") == want["spec"]["devices"]
        and spec.get("nodeName") == want["spec"]["nodeName"]
        and (current.get("metadata") or {}).get("ownerReferences") == want["metadata"].get("ownerReferences")
    )


# --- running it --------------------------------------------------------------------------------------------
class DraDriver:
    """Serve the registration and DRA sockets and keep the slice published until `stop`."""

    def __init__(
        self,
        cfg: AgentConfig,
        backend: GpuBackend,
        api: DraApi,
        daemons: LaneDaemons | None = None,
        lanes: LaneBook | None = None,
        dmem: DmemLanes | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.servicer = DraServicer(cfg, backend, api, daemons, lanes, dmem)
        self.registration = RegistrationServicer(cfg)
        self.slices = SlicePublisher(cfg, backend, api)
        self.health = HealthServicer(cfg, backend, self.slices)
        self._server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._published = False  # the slice has been published since serving began

    def readiness(self) -> str | None:
        """None once the kubelet has registered the driver and the node's slice is published."""
        if self._server is None:
            return f"the DRA driver is not serving on {self.cfg.dra_socket}"
        if not self.registration.registered.is_set():
            refused = (
                f" (last refusal: {self.registration.last_error})" if self.registration.last_error else ""
            )
            return f"waiting for the kubelet to register {contract.DRA_DRIVER}{refused}"
        if not self._published:
            return "waiting to publish the node's ResourceSlice"
        return None

    async def serve(self) -> None:
        for sock in (self.cfg.dra_socket, self.cfg.dra_registration_socket):
            sock.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()  # a stale socket from a previous run would make bind fail
        # CDI mounts, unlike the kubelet's, are not created by the runtime: their sources must exist.
        self.cfg.cdi_dir.mkdir(parents=True, exist_ok=True)
        await self.servicer.restore_lanes()
        server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
            self.health, server
        )
        server.add_insecure_port(f"unix://{self.cfg.dra_socket}")
        await server.start()
        # The registration socket is served last: the kubelet calls GetInfo the moment it appears and then
        # dials the DRA socket, which must already answer.
        reg = grpc.aio.server()
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            self.registration, reg
        )
        reg.add_insecure_port(f"unix://{self.cfg.dra_registration_socket}")
        await reg.start()
        self._server = server
        self._reg_server = reg
        log.info("DRA driver %s serving on %s", contract.DRA_DRIVER, self.cfg.dra_socket)

    async def stop(self, grace_s: float = 1.0) -> None:
        # The registration socket goes first, so the kubelet stops sending work before the service ends.
        for attr, sock in (
            ("_reg_server", self.cfg.dra_registration_socket),
            ("_server", self.cfg.dra_socket),
        ):
            server = getattr(self, attr, None)
            if server is not None:
                await server.stop(grace_s)
                setattr(self, attr, None)
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()

    async def run(self, stop: asyncio.Event) -> None:
        await self.serve()
        health = asyncio.create_task(self._watch_health(stop))
        try:
            await self._publish_until_done(stop)
            # Again now and then: the kubelet deletes a driver's slices when its plugin stays unregistered
            # (an agent down for a while), and someone may edit or delete the slice.
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SLICE_RESYNC_S)
                if not stop.is_set():
                    await self._publish_until_done(stop)
        finally:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await health
            await self.stop()

    async def _publish_until_done(self, stop: asyncio.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                await self.slices.publish()
                self._published = True
                return
            except Exception as err:  # the API server not there yet, a conflict: try again
                log.warning("ResourceSlice not published (%s); retrying in %.1fs", err, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 10.0)

    async def _watch_health(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            event = await asyncio.to_thread(self.backend.wait_health_event, 0.2)
            if event is not None and self.slices.set_health(event.uuid, event.healthy, event.reason):
                log.warning("GPU %s is now %s: %s", event.uuid, "healthy" if event.healthy else "unhealthy",
                            event.reason)  # fmt: skip
                await self._publish_until_done(stop)
