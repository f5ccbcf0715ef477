"""The device plugin (API v1beta1) over gRPC on a unix socket, its kubelet registration and restart handling.

Device plugin API v1beta1 flow: serve first, then Register with kubelet; kubelet opens ListAndWatch, which
re-sends the full device list whenever a GPU's health changes. A new kubelet deletes every socket in the
device-plugin directory (§1.4), so the plugin polls for its socket vanishing or kubelet.sock being replaced
and then restarts its server and registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence

import grpc  # type: ignore[import-untyped]

from tessera_agent.config import AgentConfig
from tessera_agent.enforce.dmem import DmemError
from tessera_agent.enforce.dmem_lanes import DmemLanes, PodRef, pods_memory
from tessera_agent.enforce.lane_daemons import LaneDaemons
from tessera_agent.enforce.mps import MpsError
from tessera_agent.gpus.backend import GpuBackend
from tessera_agent.kubelet.allocate import (
    AllocateRequestError,
    ContainerAllocation,
    choose_pod,
    container_allocation,
    preferred_slots,
)
from tessera_agent.kubelet.slots import slot_ids
from tessera_agent.lanes.book import LaneBook
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod, PodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        cfg: AgentConfig,
        backend: GpuBackend,
        pods: PodSource,
        metrics: AgentMetrics | None = None,
        lanes: LaneBook | None = None,
        daemons: LaneDaemons | None = None,
        dmem: DmemLanes | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.dmem = dmem  # lanes' memory on their pod cgroups, written at PreStartContainer (None: off)
        self.pods = pods
        self.lanes = lanes  # HP/BE lanes: class env and per-GPU admission (None: off)
        # each lane's directories and MPS daemon (default: directories only, no MPS)
        self.daemons = daemons if daemons is not None else LaneDaemons.directories_only(cfg.mps_root)
        self._gpus = {g.uuid: g for g in backend.gpus()}
        self._health = {g.uuid: g.healthy for g in backend.gpus()}
        self._version = 0
        self._changed = asyncio.Condition()
        self._allocate_lock = asyncio.Lock()
        self._served: set[str] = set()  # pod UIDs served, in case the API has not shown our mark yet
        self._slot_pods: dict[str, NodePod] = {}  # device ID → the pod Allocate last served it to
        self.watchers = 0  # ListAndWatch streams open: a kubelet connected to this server

    # --- state ---
    def devices(self) -> list[api_pb2.Device]:
        return [
            api_pb2.Device(ID=sid, health=HEALTHY if healthy else UNHEALTHY)
            for uuid, healthy in sorted(self._health.items())
            for sid in slot_ids(uuid, self.cfg.slots_per_gpu)
        ]

    async def set_health(self, uuid: str, healthy: bool, reason: str = "") -> None:
        if uuid not in self._health:
            log.warning("health event for unknown GPU %s ignored", uuid)
            return
        if self._health[uuid] == healthy:
            return
        log.warning(
            "GPU %s is now %s%s", uuid, HEALTHY if healthy else UNHEALTHY, f": {reason}" if reason else ""
        )
        async with self._changed:
            self._health[uuid] = healthy
            self._version += 1
            self._changed.notify_all()

    # --- RPCs ---
    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: object
    ) -> api_pb2.DevicePluginOptions:
        return self.options()

    def options(self) -> api_pb2.DevicePluginOptions:
        # PreStartContainer only where it has work: writing the lane's dmem limits before the container starts
        return api_pb2.DevicePluginOptions(
            pre_start_required=self.dmem is not None, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: object
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        seen = -1
        self.watchers += 1
        try:
            while True:
                async with self._changed:
                    while self._version == seen:
                        await self._changed.wait()
                    seen = self._version
                    devices = self.devices()
                yield api_pb2.ListAndWatchResponse(devices=devices)
        finally:
            self.watchers -= 1

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        pods = await self._pending_pods()
        out = []
        for req in request.container_requests:
            try:
                ids = preferred_slots(
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                    pods,
                    self.cfg.node_name,
                )
            except (AllocateRequestError, ValueError) as err:  # ValueError: a malformed device ID
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            out.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=out)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        responses = []
        async with self._allocate_lock:
            for req in request.container_requests:
                ids = list(req.devices_ids)
                try:
                    unhealthy = [d for d in ids if not self._health.get(d.rpartition("::")[0], False)]
                    if unhealthy:
                        raise AllocateRequestError(f"devices {', '.join(unhealthy)} are unhealthy or unknown")
                    pod = choose_pod(ids, await self._pending_pods(), self.cfg.node_name)
                    alloc = container_allocation(pod, self.cfg, self.lanes, self._gpus)
                    await self._enforce(alloc)
                    await self.pods.mark_allocated(pod, ids)
                except (AllocateRequestError, ValueError) as err:  # ValueError: a malformed device ID
                    log.warning("Allocate %s refused: %s", ids, err)
                    self._count("error")
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
                self._served.add(pod.uid)
                self._slot_pods.update(dict.fromkeys(ids, pod))
                self._count("ok")
                log.info("Allocate %s -> pod %s lane %s", ids, pod.key, alloc.envs.get("TESSERA_LANE_ID"))
                responses.append(
                    api_pb2.ContainerAllocateResponse(
                        envs=alloc.envs,
                        mounts=[
                            api_pb2.Mount(
                                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                            )
                            for m in alloc.mounts
                        ],
                        devices=[
                            api_pb2.DeviceSpec(
                                container_path=d.container_path,
                                host_path=d.host_path,
                                permissions=d.permissions,
                            )
                            for d in alloc.devices
                        ],
                    )
                )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def _enforce(self, alloc: ContainerAllocation) -> None:
        """Set up the lane's directories and start its MPS daemon, or refuse the pod with the reason."""
        try:
            await self.daemons.ensure(alloc.pod.uid, alloc.limits())
        except MpsError as err:
            await self.daemons.release(alloc.pod.uid)
            raise AllocateRequestError(
                f"pod {alloc.pod.key}: its lane's MPS daemon did not start: {err}"
            ) from None

    async def keep_lanes(self, pods: Sequence[NodePod], listed_at: float) -> None:
        """Match lanes to the node's pods (listed at time.monotonic() `listed_at`): release the lanes of
        pods gone or finished, and start the daemon of an allocated pod that has none (after a restart)."""
        live = [p for p in pods if not p.finished]
        await self.daemons.sync({p.uid for p in live}, listed_at)
        if not self.daemons.mps:
            return
        for p in live:
            if not p.allocated or p.assignment is None or self.daemons.running(p.uid) is not None:
                continue
            try:
                await self._enforce(container_allocation(p, self.cfg, self.lanes, self._gpus))
                log.info("lane of pod %s: MPS daemon restarted", p.key)
            except AllocateRequestError as err:
                log.warning("lane of pod %s runs without its MPS daemon: %s", p.key, err)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        """The kubelet is about to start a container holding these slots, the pod's cgroup made: the lane's
        memory written on it as dmem limits (`enforce/dmem_lanes`)."""
        if self.dmem is None:
            return api_pb2.PreStartContainerResponse()
        ids = list(request.devices_ids)
        try:
            pod = await self._pod_of_slots(ids)
        except AllocateRequestError as err:
            log.warning("PreStartContainer %s: no dmem limit written: %s", ids, err)
            self.dmem.count_failure()
            if self.dmem.required:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            return api_pb2.PreStartContainerResponse()
        a = pod.assignment
        assert a is not None  # only pods with an assignment are served
        memory = pods_memory([({u: a.memory_mib for u in a.gpu_uuids}, [pod.uid])])[pod.uid]
        try:
            await self.dmem.apply(PodRef(pod.uid, pod.namespace, pod.name), memory, when="PreStartContainer")
        except DmemError as err:  # required: the kubelet fails this start and tries again
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"pod {pod.key}: {err}")
        return api_pb2.PreStartContainerResponse()

    async def _pod_of_slots(self, ids: Sequence[str]) -> NodePod:
        """The pod Allocate served these slots to: as recorded here, else (after a restart) the running pod
        whose tessera.io/allocated names them."""
        known = {self._slot_pods[d].uid: self._slot_pods[d] for d in ids if d in self._slot_pods}
        if len(known) == 1 and len(ids) == sum(d in self._slot_pods for d in ids):
            return next(iter(known.values()))
        pods = [
            p
            for p in await self.pods.pods_on_node(self.cfg.node_name)
            if p.assignment is not None and not p.finished and set(ids) & set(p.allocated_ids)
        ]
        if len(pods) != 1:
            found = ", ".join(sorted(p.key for p in pods)) or "none"
            raise AllocateRequestError(
                f"slots {', '.join(ids)} were served to no single pod (found: {found})"
            )
        return pods[0]

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.counter("tessera_device_plugin_allocations_total").labels(
                node=self.cfg.node_name, result=result
            ).inc()

    async def _pending_pods(self) -> list:  # type: ignore[type-arg]
        pods = await self.pods.pods_on_node(self.cfg.node_name)
        return [p for p in pods if p.uid not in self._served]


# The kubelet's answer to a Register for a socket it is connected to (pkg/kubelet/cm/devicemanager)
ALREADY_CONNECTED = "device plugin already connected"


class DevicePlugin:
    """Owns the gRPC server's lifecycle: serve, register, watch for kubelet restarts, shut down cleanly."""

    def __init__(
        self,
        cfg: AgentConfig,
        backend: GpuBackend,
        pods: PodSource,
        metrics: AgentMetrics | None = None,
        lanes: LaneBook | None = None,
        daemons: LaneDaemons | None = None,
        dmem: DmemLanes | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.servicer = DevicePluginServicer(cfg, backend, pods, metrics, lanes, daemons, dmem)
        self._server: grpc.aio.Server | None = None
        self._kubelet_inode: int | None = None
        self._registered = False  # the kubelet took the current server's registration
        self.registrations = 0
        self.on_registered: Callable[[], None] | None = None

    async def serve(self) -> None:
        sock = self.cfg.plugin_socket
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()  # a stale socket from a previous run would make bind fail
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        self._server = server
        log.info("device plugin serving on %s", sock)

    async def register(self, timeout_s: float = 10.0) -> None:
        # 10 s: the kubelet's Register dials this server back with a 10 s deadline of its own before answering
        kubelet = self.cfg.kubelet_socket
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            try:
                await stub.Register(
                    api_pb2.RegisterRequest(
                        version=API_VERSION,
                        endpoint=self.cfg.socket_name,
                        resource_name=self.cfg.resource_name,
                        options=self.servicer.options(),
                    ),
                    timeout=timeout_s,
                )
            except grpc.aio.AioRpcError as err:
                # A Register whose answer was lost (our deadline passed after the kubelet had connected) makes
                # the kubelet refuse every later one for this socket (devicemanager's PluginConnected). That
                # is registered when the kubelet is watching this very server; a kubelet that has yet to see
                # a previous server on the socket go says the same, and is asked again.
                if ALREADY_CONNECTED not in (err.details() or "") or not self.servicer.watchers:
                    raise
                log.info(
                    "the kubelet holds a connection to %s already: %s", self.cfg.plugin_socket, err.details()
                )
        self._kubelet_inode = os.stat(kubelet).st_ino
        self._registered = True
        self.registrations += 1
        log.info("registered %s with kubelet at %s", self.cfg.resource_name, kubelet)
        if self.on_registered:
            self.on_registered()

    def readiness(self) -> str | None:
        """None once the kubelet has taken this server's registration; else what is awaited."""
        if self._server is None:
            return f"the device plugin is not serving on {self.cfg.plugin_socket}"
        if not self._registered:
            return f"waiting for the kubelet at {self.cfg.kubelet_socket} to take {self.cfg.resource_name}"
        return None

    async def stop(self, grace_s: float = 1.0) -> None:
        self._registered = False
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.cfg.plugin_socket.unlink()

    def kubelet_restarted(self) -> bool:
        if not self.cfg.plugin_socket.exists():
            return True
        try:
            return os.stat(self.cfg.kubelet_socket).st_ino != self._kubelet_inode
        except FileNotFoundError:
            return True

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, re-registering after every kubelet restart."""
        health = asyncio.create_task(self._watch_health(stop))
        try:
            await self._start_and_register(stop)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.cfg.restart_poll_s)
                if not stop.is_set() and self.kubelet_restarted():
                    log.warning("kubelet restart detected (socket recreated); restarting and re-registering")
                    await self.stop()
                    await self._start_and_register(stop)
        finally:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await health
            await self.stop()

    async def _start_and_register(self, stop: asyncio.Event) -> None:
        await self.serve()
        delay = 0.1
        while not stop.is_set():
            try:
                await self.register()
                return
            except (grpc.aio.AioRpcError, FileNotFoundError) as err:
                log.info(
                    "kubelet not ready at %s (%s); retrying in %.1fs", self.cfg.kubelet_socket, err, delay
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 5.0)

    async def _watch_health(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            event = await asyncio.to_thread(self.backend.wait_health_event, 0.2)
            if event is not None:
                await self.servicer.set_health(event.uuid, event.healthy, event.reason)
