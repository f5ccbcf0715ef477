"""The GPU-node taint (chart value gpuNodes.reserve) against an HTTP API server (kmock's KubernetesEmulator):
the running agent taints its own Node with --reserve-node and removes the taint without it, other taints
stay, a second start changes nothing, conflicting writers are retried, and the uninstall hook's
--forget-nodes clears the taint with the inventory annotation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import pytest
from tessera.api import contract
from tessera.kube import KubeClient, KubeConfig, KubeError
from tessera_agent.agent import NodeAgent
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.gpus.inventory import KubernetesNodePatcher, forget_nodes
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import StaticPodSource
from tessera_agent.reserve import reserve_taint, set_reserved, taints_with

from .agent_fake_kubelet import FakeKubelet

NODE = "node-a"
NODES = "v1/nodes"
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}


@pytest.fixture
async def api(kmock: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    kmock.resources[NODES] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs={"list", "watch", "get", "patch"}
    )
    kube = KubeClient(KubeConfig(str(kmock.url).rstrip("/")))
    yield kube
    await kube.close()


def seed_node(
    kmock: kmock.KubernetesEmulator,
    name: str = NODE,
    taints: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    kmock.objects[NODES, None, name] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "7", "annotations": annotations or {}},
        "spec": {"taints": taints} if taints else {},
    }


async def taints(api: KubeClient, name: str = NODE) -> list[dict[str, Any]]:
    node = await api.get_node(name)
    return list((node.get("spec") or {}).get("taints") or [])


def node_patches(kmock: kmock.KubernetesEmulator) -> list[Any]:
    return [r for r in kmock if r.method == "PATCH" and r.resource and r.resource.plural == "nodes"]


async def eventually(check: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_taints_with_sets_replaces_and_removes_by_key_and_effect() -> None:
    mine = reserve_taint()
    assert mine == {"key": "tessera.io/gpu-node", "value": "reserved", "effect": "NoSchedule"}
    assert taints_with([OTHER], mine, True) == [OTHER, mine]
    assert taints_with([OTHER, mine], mine, True) is None  # already there: no write
    assert taints_with([{**mine, "value": "old"}], mine, True) == [mine]  # same key and effect: replaced
    assert taints_with([OTHER, mine], mine, False) == [OTHER]
    assert taints_with([OTHER], mine, False) is None
    # A taint of the same key with another effect is someone else's.
    prefer = {**mine, "effect": "PreferNoSchedule"}
    assert taints_with([prefer], mine, False) is None


async def test_set_reserved_keeps_other_taints_and_writes_only_on_change(
    kmock: kmock.KubernetesEmulator, api: KubeClient
) -> None:
    seed_node(kmock, taints=[OTHER, NOT_READY])
    assert await set_reserved(api, NODE, True)
    assert await taints(api) == [OTHER, NOT_READY, reserve_taint()]
    # The write names the version it read: a concurrent writer's taint is never overwritten blindly.
    (patch,) = node_patches(kmock)
    assert patch.data["metadata"]["resourceVersion"] == "7"
    assert not await set_reserved(api, NODE, True)
    assert len(node_patches(kmock)) == 1
    assert await set_reserved(api, NODE, False)
    assert await taints(api) == [OTHER, NOT_READY]
    assert not await set_reserved(api, NODE, False)


async def test_set_reserved_reads_again_after_a_conflict() -> None:
    class Conflicting(KubeClient):
        """A Node that another writer changes between each read and write, `conflicts` times."""

        def __init__(self, conflicts: int) -> None:
            super().__init__(KubeConfig("http://unused"))
            self.conflicts, self.reads, self.written = conflicts, 0, None

        async def get_node(self, name: str) -> dict[str, Any]:
            self.reads += 1
            return {"metadata": {"name": name, "resourceVersion": str(self.reads)}, "spec": {}}

        async def patch_node_taints(
            self, name: str, taints: list[dict[str, Any]], *, resource_version: str | None = None
        ) -> dict[str, Any]:
            if self.conflicts:
                self.conflicts -= 1
                raise KubeError("PATCH: HTTP 409: conflict", 409)
            self.written = (taints, resource_version)
            return {}

    api = Conflicting(2)
    assert await set_reserved(api, NODE, True)
    assert api.reads == 3 and api.written == ([reserve_taint()], "3")
    with pytest.raises(KubeError, match="changed under each of 5 attempts"):
        await set_reserved(Conflicting(5), NODE, True)


async def run_agent(api: KubeClient, plugin_dir: Path, kubelet: FakeKubelet, *, reserve: bool) -> None:
    """One agent start on NODE, until the Node's taint is as configured."""
    cfg = AgentConfig(node_name=NODE, device_plugin_dir=plugin_dir, reserve_node=reserve)
    agent = NodeAgent(
        cfg,
        FakeGpuBackend.uniform(1),
        StaticPodSource([]),
        KubernetesNodePatcher(api),
        AgentMetrics(),
        sample_interval_s=0.05,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))

    async def as_configured() -> bool:
        return (reserve_taint() in await taints(api)) == reserve

    try:
        await eventually(as_configured, f"the agent to {'set' if reserve else 'remove'} the taint")
        # The inventory is published beside it.
        node = await api.get_node(NODE)
        assert contract.ANN_NODE_GPUS in node["metadata"]["annotations"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_the_agent_taints_its_node_when_reserved_and_untaints_it_when_not(
    kmock: kmock.KubernetesEmulator, api: KubeClient, plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    seed_node(kmock, taints=[OTHER])
    await run_agent(api, plugin_dir, kubelet, reserve=True)
    assert await taints(api) == [OTHER, reserve_taint()]
    # The value turned off and the agents restarted: the taint goes, the admin's stays.
    await run_agent(api, plugin_dir, kubelet, reserve=False)
    assert await taints(api) == [OTHER]


async def test_forget_nodes_removes_the_taint_and_the_annotation(
    kmock: kmock.KubernetesEmulator, api: KubeClient
) -> None:
    seed_node(
        kmock,
        "gpu-a",
        taints=[OTHER, reserve_taint()],
        annotations={contract.ANN_NODE_GPUS: "[]", contract.ANN_NODE_LANE_ENFORCEMENT: "{}", "keep": "me"},
    )
    seed_node(kmock, "gpu-b", taints=[reserve_taint()])
    seed_node(kmock, "cpu", taints=[OTHER])
    assert sorted(await forget_nodes(api)) == ["gpu-a", "gpu-b"]
    assert await taints(api, "gpu-a") == [OTHER]
    assert await taints(api, "gpu-b") == []
    assert await taints(api, "cpu") == [OTHER]
    left = (await api.get_node("gpu-a"))["metadata"]["annotations"]
    assert contract.ANN_NODE_GPUS not in left and contract.ANN_NODE_LANE_ENFORCEMENT not in left
    assert left.get("keep") == "me"
