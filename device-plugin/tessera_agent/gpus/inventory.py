"""The `tessera.io/gpus` node annotation: what the extender may carve lanes from, kept current.

Per GPU: UUID, index, model, usable memory (total minus the driver's reserve and an optional margin; not
deducting it overcommits, KAI-Scheduler#2212) and health. Built and serialised with the extender's own
schema (`tessera.api.gpu_inventory`), so what the agent writes is exactly what the extender parses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.kube import KubeClient, default_config

from tessera_agent.gpus.backend import GpuBackend, usable_memory_mib
from tessera_agent.reserve import has_reserve_taint, set_reserved

log = logging.getLogger(__name__)


class InventoryError(ValueError):
    """The node's GPUs cannot be published as an inventory, with the reason."""


def node_gpus(backend: GpuBackend, *, extra_reserve_mib: int = 0) -> list[GpuInfo]:
    """The inventory entries for the backend's GPUs; a GPU left with no usable memory is an error, since
    publishing it would advertise a GPU no lane fits on (and the schema rejects it)."""
    out = []
    for g in backend.gpus():
        usable = usable_memory_mib(g, extra_reserve_mib)
        if usable <= 0:
            raise InventoryError(
                f"GPU {g.index} ({g.uuid}) has no usable memory: {g.memory_total_bytes >> 20} MiB total, "
                f"{g.memory_reserved_bytes >> 20} MiB reserved by the driver, {extra_reserve_mib} MiB extra "
                "reserve; lower --extra-reserve-mib"
            )
        out.append(GpuInfo(uuid=g.uuid, index=g.index, model=g.model, memory_mib=usable, healthy=g.healthy))
    return out


def gpu_inventory(backend: GpuBackend, *, extra_reserve_mib: int = 0) -> list[dict[str, Any]]:
    """The inventory as the JSON objects of the annotation (camelCase keys)."""
    return [g.model_dump(by_alias=True) for g in node_gpus(backend, extra_reserve_mib=extra_reserve_mib)]


class NodeAnnotator(Protocol):
    async def annotate(self, node: str, annotations: dict[str, str]) -> None: ...


class NodePatcher(NodeAnnotator, Protocol):
    async def reserve(self, node: str, reserved: bool) -> bool:
        """Set (reserved) or remove the GPU-node taint; True when the Node changed."""
        ...


class KubernetesNodePatcher(NodePatcher):
    def __init__(self, api: KubeClient | None = None) -> None:
        self._api = api if api is not None else KubeClient(default_config())

    async def annotate(self, node: str, annotations: dict[str, str]) -> None:
        await self._api.patch_node_annotations(node, annotations)

    async def reserve(self, node: str, reserved: bool) -> bool:
        return await set_reserved(self._api, node, reserved)


async def forget_nodes(api: KubeClient) -> list[str]:
    """Remove the inventory annotation and the GPU-node taint from every Node that has either (the chart's
    pre-delete hook: an uninstalled Tessera leaves neither behind); the names of the Nodes changed."""
    nodes = (await api.list_nodes()).get("items") or []
    changed = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name = str(meta["name"])
        ours = [
            a
            for a in (contract.ANN_NODE_GPUS, contract.ANN_NODE_LANE_ENFORCEMENT)
            if a in (meta.get("annotations") or {})
        ]
        annotated = bool(ours)
        if annotated:
            # A merge patch's null removes the key.
            await api.patch_node_annotations(name, dict.fromkeys(ours))
        tainted = has_reserve_taint(node) and await set_reserved(api, name, False)
        if annotated or tainted:
            changed.append(name)
    return changed


class InventoryPublisher:
    """Writes the annotation when it differs from what was last written (health flips, GPUs appear)."""

    def __init__(
        self,
        node: str,
        backend: GpuBackend,
        patcher: NodeAnnotator,
        *,
        extra_reserve_mib: int = 0,
        enforcement: Mapping[str, str] | None = None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.patcher = patcher
        self.extra_reserve_mib = extra_reserve_mib
        # what enforces each lane limit here, beside the inventory (`enforce.mechanism.mechanisms`)
        self.enforcement = json.dumps(dict(enforcement), sort_keys=True) if enforcement else None
        self._last: dict[str, str] = {}

    async def publish_if_changed(self) -> bool:
        wanted = {
            contract.ANN_NODE_GPUS: dump_node_gpus(
                node_gpus(self.backend, extra_reserve_mib=self.extra_reserve_mib)
            )
        }
        if self.enforcement is not None:
            wanted[contract.ANN_NODE_LANE_ENFORCEMENT] = self.enforcement
        changed = {k: v for k, v in wanted.items() if self._last.get(k) != v}
        if not changed:
            return False
        await self.patcher.annotate(self.node, changed)
        self._last.update(changed)
        log.info("node %s: %s updated", self.node, ", ".join(changed))
        return True
