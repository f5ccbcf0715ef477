"""Runs the node agent's parts together until stopped: device plugin, MPS daemon, inventory, telemetry,
and (opt-in) the lane coordinator and progress endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from .backend import GpuBackend
from .config import AgentConfig
from .coordinator import LaneCoordinator
from .inventory import InventoryPublisher, NodePatcher
from .metrics_factory import AgentMetrics
from .mps import MpsManager
from .peers import PeerResolver
from .plugin import DevicePlugin
from .pods import PodSource
from .progress import ProgressServer
from .telemetry import LaneTelemetry

log = logging.getLogger(__name__)


@dataclass
class NodeAgent:
    cfg: AgentConfig
    backend: GpuBackend
    pods: PodSource
    patcher: NodePatcher | None
    metrics: AgentMetrics
    mps: MpsManager | None = None
    coordinator: LaneCoordinator | None = None
    sample_interval_s: float = 10.0

    async def run(self, stop: asyncio.Event) -> None:
        plugin = DevicePlugin(self.cfg, self.backend, self.pods, self.metrics)
        tasks = [asyncio.create_task(plugin.run(stop)), asyncio.create_task(self._sample(stop))]
        if self.mps is not None:
            tasks.append(asyncio.create_task(self.mps.run(stop)))
        if self.coordinator is not None:
            await self.coordinator.start()
        progress = (
            ProgressServer(
                self.cfg.node_name,
                self.pods,
                socket_path=self.cfg.progress_socket,
                peers=peer_resolver(self.cfg, self.pods),
                socket_group=self.cfg.socket_group,
            )
            if self.cfg.progress_socket is not None
            else None
        )
        if progress is not None:
            await progress.start()

        async def close_sockets() -> None:
            # on stop, the sockets stop accepting first, while the device plugin winds down
            await stop.wait()
            await self._close(progress)

        tasks.append(asyncio.create_task(close_sockets()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await self._close(progress)
            self.backend.close()

    async def _close(self, progress: ProgressServer | None) -> None:
        if self.coordinator is not None:
            await self.coordinator.stop()
        if progress is not None:
            await progress.stop()

    async def _sample(self, stop: asyncio.Event) -> None:
        telemetry = LaneTelemetry(self.cfg.node_name, self.backend, self.metrics)
        inventory = (
            InventoryPublisher(
                self.cfg.node_name, self.backend, self.patcher, extra_reserve_mib=self.cfg.extra_reserve_mib
            )
            if self.patcher is not None
            else None
        )
        while not stop.is_set():
            try:
                if inventory is not None:
                    await inventory.publish_if_changed()
                telemetry.update(await self.pods.pods_on_node(self.cfg.node_name))
            except Exception:  # keep the agent up through API hiccups; the next round retries
                log.exception("sampling round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.sample_interval_s)


def peer_resolver(cfg: AgentConfig, pods: PodSource) -> PeerResolver | None:
    """What maps socket peers to pods, or None where the configuration turns the check off."""
    if not cfg.peer_check:
        log.warning("peer check is off: any process that can open the node sockets acts for any pod")
        return None
    return PeerResolver(cfg.node_name, pods, proc_root=cfg.proc_root)
