"""Runs the node agent's parts together until stopped: device plugin, lanes' MPS daemons, inventory, telemetry, the
GPU-node taint (set or cleared once at start), the lane audit (device-plugin mode), and (opt-in) the lane
coordinator, the progress endpoint, HP/BE lanes and the BE feedback loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera_agent.config import AgentConfig
from tessera_agent.enforce.dmem_lanes import DmemLanes, PodRef, assigned_lanes, pods_memory
from tessera_agent.enforce.lane_daemons import LaneDaemons
from tessera_agent.gpus.backend import GpuBackend, usable_memory_mib
from tessera_agent.gpus.inventory import InventoryPublisher, NodePatcher
from tessera_agent.gpus.telemetry import LaneTelemetry
from tessera_agent.kubelet.dra_feedback import ClaimLanes, ClaimPodRestarter
from tessera_agent.kubelet.dra_plugin import DraApi, DraDriver
from tessera_agent.kubelet.lane_audit import LaneAudit
from tessera_agent.kubelet.plugin import DevicePlugin
from tessera_agent.lanes.book import LaneBook
from tessera_agent.lanes.coordinator import LaneCoordinator
from tessera_agent.lanes.interference import (
    EventSink,
    InterferenceLoop,
    ProgressLatency,
    Restarter,
    WindowedLatency,
    agent_metrics_sink,
)
from tessera_agent.lanes.peers import PeerResolver
from tessera_agent.lanes.progress import ClaimHolders, LaneHolders, ProgressServer
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod, PodSource

log = logging.getLogger(__name__)


@dataclass
class NodeAgent:
    cfg: AgentConfig
    backend: GpuBackend
    pods: PodSource
    patcher: NodePatcher | None
    metrics: AgentMetrics
    daemons: LaneDaemons | None = None  # each lane's directories and MPS daemon; None: directories only
    coordinator: LaneCoordinator | None = None
    sample_interval_s: float = 10.0
    # The BE feedback loop's hands on Kubernetes (restarts.py); required when cfg.be_feedback is on.
    restarter: Restarter | None = None
    events: EventSink | None = None
    dra: DraApi | None = None  # the API server as the DRA driver needs it; required with lanes_api "dra"
    audit: LaneAudit | None = None  # device-plugin mode: containers checked against their pods' lanes
    enforcement: dict[str, str] | None = None  # limit → mechanism, published on the Node beside the inventory
    dmem: DmemLanes | None = None  # lanes' memory on their pod cgroups (cgroup dmem); None: not on this node
    clock: Callable[[], float] = time.time
    lanes: LaneBook | None = field(init=False, default=None)
    loop: InterferenceLoop | None = field(init=False, default=None)
    _progress_latency: ProgressLatency | None = field(init=False, default=None)
    _claims: ClaimLanes | None = field(init=False, default=None)  # DRA: the pods of each claim's lane
    _lanes_api: DevicePlugin | DraDriver | None = field(init=False, default=None)
    _stopping: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.daemons is None:
            self.daemons = LaneDaemons.directories_only(self.cfg.mps_root)
        if not self.cfg.hp_be_lanes:
            return
        self.lanes = LaneBook(
            {g.uuid: usable_memory_mib(g, self.cfg.extra_reserve_mib) for g in self.backend.gpus()},
            hp_priority_classes=self.cfg.hp_priority_classes,
            default_be_percent=self.cfg.be_percent,
        )
        if not self.cfg.be_feedback:
            return
        if self.restarter is None or self.events is None:
            raise ValueError("the BE feedback loop needs a pod restarter and an event sink (Kubernetes API)")
        latency = WindowedLatency()
        self._progress_latency = ProgressLatency(self.lanes, latency)
        self.loop = InterferenceLoop(
            self.lanes,
            latency,
            self.restarter,
            self.events,
            node=self.cfg.node_name,
            epsilon=self.cfg.be_epsilon,
            min_interval_s=self.cfg.be_min_interval_s,
            hysteresis=self.cfg.be_hysteresis,
            on_metric=agent_metrics_sink(self.metrics),
        )

    def readiness(self) -> str | None:
        """For the readiness probe: None while the kubelet can allocate lanes here; else what is awaited."""
        if self._stopping:
            return "stopping"
        if self._lanes_api is None:
            return "starting"
        return self._lanes_api.readiness()

    async def run(self, stop: asyncio.Event) -> None:
        lanes_api: DevicePlugin | DraDriver
        holders = LaneHolders()
        if self.cfg.lanes_api == "dra":
            if self.dra is None:
                raise ValueError("the DRA driver needs the Kubernetes API (claims and ResourceSlices)")
            lanes_api = DraDriver(self.cfg, self.backend, self.dra, self.daemons, self.lanes, self.dmem)
            holders = ClaimHolders(self.cfg.node_name, lanes_api.servicer.holds_lane)
            servicer = lanes_api.servicer
            if self.coordinator is not None:  # a DRA pod's lanes are the claims prepared for it
                self.coordinator.lanes_held = lambda pod: servicer.lanes_held(pod.namespace, pod.uid)
            self._claims = ClaimLanes(servicer)
            if self.loop is not None:  # lanes keyed by claim: the loop acts on the pods of each claim
                assert self._progress_latency is not None
                self._progress_latency.lanes_of = self._claims.lanes_of
                self.loop.pods_of = self._claims.pods_of
                self.loop.on_share = servicer.apply_be_share
                self.loop.restarter = ClaimPodRestarter(self.loop.restarter, servicer)
        else:
            lanes_api = DevicePlugin(
                self.cfg, self.backend, self.pods, self.metrics, self.lanes, self.daemons, self.dmem
            )
        self._lanes_api = lanes_api
        tasks = [asyncio.create_task(lanes_api.run(stop)), asyncio.create_task(self._sample(stop, lanes_api))]
        if self.audit is not None and self.cfg.lanes_api == "devicePlugin":
            tasks.append(asyncio.create_task(self.audit.run(stop, self.cfg.lane_audit_interval_s)))
        if self.loop is not None:
            tasks.append(asyncio.create_task(self._feedback(stop, self.loop)))
        if self.coordinator is not None:
            await self.coordinator.start()
        progress = (
            ProgressServer(
                self.cfg.node_name,
                self.pods,
                socket_path=self.cfg.progress_socket,
                peers=peer_resolver(self.cfg, self.pods),
                socket_group=self.cfg.socket_group,
                clock=self.clock,
                on_report=self._progress_latency.on_report if self._progress_latency else None,
                holders=holders,
            )
            if self.cfg.progress_socket is not None
            else None
        )
        if progress is not None:
            await progress.start()

        async def close_sockets() -> None:
            # on stop, the sockets stop accepting first, while the device plugin winds down
            await stop.wait()
            self._stopping = True
            await self._close(progress)

        tasks.append(asyncio.create_task(close_sockets()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await self._close(progress)
            assert self.daemons is not None
            await self.daemons.close()
            self.backend.close()

    async def _close(self, progress: ProgressServer | None) -> None:
        if self.coordinator is not None:
            await self.coordinator.stop()
        if progress is not None:
            await progress.stop()

    async def _sample(self, stop: asyncio.Event, lanes_api: DevicePlugin | DraDriver) -> None:
        plugin = lanes_api if isinstance(lanes_api, DevicePlugin) else None
        dra = lanes_api if isinstance(lanes_api, DraDriver) else None
        telemetry = LaneTelemetry(self.cfg.node_name, self.backend, self.metrics)
        inventory = (
            InventoryPublisher(
                self.cfg.node_name,
                self.backend,
                self.patcher,
                extra_reserve_mib=self.cfg.extra_reserve_mib,
                enforcement=self.enforcement,
            )
            if self.patcher is not None
            else None
        )
        reserved = self.patcher is None  # the taint is set or cleared once, retried each round until it lands
        while not stop.is_set():
            if not reserved and self.patcher is not None:
                reserved = await self._reserve(self.patcher)
            try:
                if inventory is not None:
                    await inventory.publish_if_changed()
                assert self.daemons is not None
                listed_at = self.daemons.clock()
                pods = await self.pods.pods_on_node(self.cfg.node_name)
                telemetry.update(pods, dra.servicer.held_lanes(pods) if dra is not None else None)
                if self._claims is not None:  # claims enter the book at prepare and leave it at unprepare
                    self._claims.note_pods(pods)
                elif self.lanes is not None:
                    for problem in self.lanes.refresh(pods):
                        log.warning("lane not recorded: %s", problem)
                if self._progress_latency is not None:
                    self._progress_latency.forget({p.uid for p in pods})
                if plugin is not None:  # after the lane book, whose classes a restarted daemon takes
                    await plugin.servicer.keep_lanes(pods, listed_at)
                if self.dmem is not None:
                    await self._dmem_round(self.dmem, pods, listed_at, dra)
            except Exception:  # keep the agent up through API hiccups; the next round retries
                log.exception("sampling round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.sample_interval_s)

    async def _dmem_round(
        self, dmem: DmemLanes, pods: list[NodePod], listed_at: float, dra: DraDriver | None
    ) -> None:
        """Every lane's pods held to its memory on their cgroups, after a restart too; pods whose lanes went
        released (their protection zeroed, their ancestors' recomputed)."""
        if dra is not None:
            await dra.servicer.refresh_claim_pods()  # a pod that shares a claim later is only in its status
            lanes = dra.servicer.claim_lanes()
        else:
            lanes = assigned_lanes(pods)
        refs = {p.uid: PodRef(p.uid, p.namespace, p.name) for p in pods}
        await dmem.sync(pods_memory(lanes), refs, listed_at)

    async def _reserve(self, patcher: NodePatcher) -> bool:
        """Set or clear this Node's GPU-node taint as configured; False when the API call failed."""
        try:
            await patcher.reserve(self.cfg.node_name, self.cfg.reserve_node)
        except Exception:  # an API hiccup must not stop the agent; the next round retries
            log.exception("setting the GPU-node taint failed")
            return False
        return True

    async def _feedback(self, stop: asyncio.Event, loop: InterferenceLoop) -> None:
        """Step the BE feedback loop every `be_step_interval_s` until stopped."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.be_step_interval_s)
            if stop.is_set():
                return
            try:
                await loop.step(self.clock())
            except Exception:  # an API hiccup must not end the loop; the next step retries
                log.exception("BE feedback step failed")


def peer_resolver(cfg: AgentConfig, pods: PodSource) -> PeerResolver | None:
    """What maps socket peers to pods, or None where the configuration turns the check off."""
    if not cfg.peer_check:
        log.warning("peer check is off: any process that can open the node sockets acts for any pod")
        return None
    return PeerResolver(cfg.node_name, pods, proc_root=cfg.proc_root)
