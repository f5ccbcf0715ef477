"""The `tessera.io/gpus` node annotation: what the extender may carve lanes from, kept current.

Per GPU: UUID, index, model, usable memory (total minus the driver's reserve and an optional margin; not
deducting it overcommits, anchors.md on KAI #2212) and health.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Protocol

from tessera.api import contract

from .backend import GpuBackend, usable_memory_mib

log = logging.getLogger(__name__)


def gpu_inventory(backend: GpuBackend, *, extra_reserve_mib: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "uuid": g.uuid,
            "index": g.index,
            "model": g.model,
            "memoryMiB": usable_memory_mib(g, extra_reserve_mib),
            "healthy": g.healthy,
        }
        for g in backend.gpus()
    ]


class NodePatcher(Protocol):
    async def annotate(self, node: str, annotations: dict[str, str]) -> None: ...


class KubernetesNodePatcher(NodePatcher):
    def __init__(self, api: Any | None = None) -> None:
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CoreV1Api()
        self._api = api

    async def annotate(self, node: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        await asyncio.to_thread(self._api.patch_node, node, body)


class InventoryPublisher:
    """Writes the annotation when it differs from what was last written (health flips, GPUs appear)."""

    def __init__(
        self, node: str, backend: GpuBackend, patcher: NodePatcher, *, extra_reserve_mib: int = 0
    ) -> None:
        self.node = node
        self.backend = backend
        self.patcher = patcher
        self.extra_reserve_mib = extra_reserve_mib
        self._last: str | None = None

    async def publish_if_changed(self) -> bool:
        value = json.dumps(
            gpu_inventory(self.backend, extra_reserve_mib=self.extra_reserve_mib), sort_keys=True
        )
        if value == self._last:
            return False
        await self.patcher.annotate(self.node, {contract.ANN_NODE_GPUS: value})
        self._last = value
        log.info("node %s: %s updated", self.node, contract.ANN_NODE_GPUS)
        return True
