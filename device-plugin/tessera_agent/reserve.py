"""GPU nodes kept for tessera-scheduler (chart value `gpuNodes.reserve`): the agent taints its own Node
`tessera.io/gpu-node=reserved:NoSchedule` when told to and removes that taint when not, so turning the value
off and upgrading the chart undoes it. Pods that tessera-scheduler should place carry the toleration (the
operator's, and those the chart's MutatingAdmissionPolicy routes); everything else stays off GPU nodes,
where default-scheduler's spreading would strand GPUs (docs/results-packing.md, "As deployed").

A Node's taints are one atomic list, so a change is read-modify-write with the Node's resourceVersion as a
precondition: a concurrent writer (the node lifecycle controller, kubectl taint) makes it retry, never lose
the other's taint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tessera.api import contract
from tessera.kube import KubeClient, KubeError

log = logging.getLogger(__name__)
ATTEMPTS = 5  # conflicts in a row before giving up (the agent's next sampling round tries again)


def reserve_taint() -> dict[str, str]:
    return {
        "key": contract.TAINT_GPU_NODE_KEY,
        "value": contract.TAINT_GPU_NODE_VALUE,
        "effect": contract.TAINT_GPU_NODE_EFFECT,
    }


def _same_taint(t: Mapping[str, Any], key: str, effect: str) -> bool:
    # Kubernetes identifies a taint by key and effect (kubectl taint replaces on the pair).
    return t.get("key") == key and t.get("effect") == effect


def taints_with(
    taints: Sequence[Mapping[str, Any]], taint: Mapping[str, str], present: bool
) -> list[dict[str, Any]] | None:
    """`taints` with `taint` set (present) or removed; None when nothing changes."""
    key, effect = taint["key"], taint["effect"]
    others = [dict(t) for t in taints if not _same_taint(t, key, effect)]
    if not present:
        return others if len(others) != len(taints) else None
    mine = [t for t in taints if _same_taint(t, key, effect)]
    if len(mine) == 1 and mine[0].get("value") == taint.get("value"):
        return None
    return [*others, dict(taint)]


def has_reserve_taint(node: Mapping[str, Any]) -> bool:
    taint = reserve_taint()
    taints = (node.get("spec") or {}).get("taints") or []
    return any(_same_taint(t, taint["key"], taint["effect"]) for t in taints)


async def set_reserved(api: KubeClient, node: str, reserved: bool, *, attempts: int = ATTEMPTS) -> bool:
    """Taint `node` (reserved) or remove the taint; True when the Node changed. KubeError after
    `attempts` conflicts in a row, or on any other API error."""
    for _ in range(attempts):
        obj = await api.get_node(node)
        new = taints_with((obj.get("spec") or {}).get("taints") or [], reserve_taint(), reserved)
        if new is None:
            return False
        try:
            await api.patch_node_taints(node, new, resource_version=obj["metadata"]["resourceVersion"])
        except KubeError as err:
            if err.status != 409:
                raise
            log.debug("node %s changed while its taints were written; reading it again", node)
            continue
        log.info("node %s: %s %s", node, "tainted" if reserved else "untainted", _describe(reserve_taint()))
        return True
    raise KubeError(f"node {node}: its taints changed under each of {attempts} attempts", 409)


def _describe(taint: Mapping[str, str]) -> str:
    return f"{taint['key']}={taint['value']}:{taint['effect']}"
