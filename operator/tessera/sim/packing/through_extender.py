"""The packing experiment once through the extender's own filter → prioritize → bind (in-process calls of
the same handlers kube-scheduler calls over HTTP), to show the extender runs the simulator's rule.

Nodes become Node objects with the agent's `tessera.io/gpus` annotation and `status.allocatable` CPU and
memory; every GPU is declared with 1000 MiB, so a trace share of m milli is a pod asking `tessera.io/gpu-memory`
m and `tessera.io/gpu-compute` m/10 (the same fraction of both). Each pod arrives as a watch event (the view
learns its shape), then GPU pods go through filter, prioritize (the node with the top priority is taken, as
kube-scheduler's selectHost does: the extender gives 10 to one node only) and bind. Pods asking for no GPU
never reach an extender (kube-scheduler calls it only for pods with its managed resources): here they are
bound where the same rule puts them, as a score plugin sharing the code would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.extender.server import Extender
from tessera.extender.view import ANN_GPU_MODELS, pod_spec, shape_of
from tessera.policy.lanes.fragmentation import Shape, score_rows
from tessera.policy.lanes.packing import PackingConfig, tessera_order
from tessera.sim.packing.trace import NodeSpec

NOMINAL_GPU_MIB = 1000


def node_object(n: NodeSpec) -> dict[str, Any]:
    inv = [
        GpuInfo(uuid=f"{n.name}-gpu{i}", index=i, model=n.model, memory_mib=NOMINAL_GPU_MIB)
        for i in range(n.gpus)
    ]
    return {
        "metadata": {"name": n.name, "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)}},
        "status": {"allocatable": {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi"}},
    }


def pod_object(i: int, s: Shape) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{int(s.cpu_milli)}m", "memory": f"{int(s.memory_mib)}Mi"}
    limits: dict[str, str] = {}
    if s.gpus:
        milli = round(s.compute * 1000)
        limits = {
            contract.RESOURCE_GPU: str(s.gpus),
            contract.RESOURCE_GPU_MEMORY: str(milli),
            contract.RESOURCE_GPU_COMPUTE: str(milli // 10),
        }
    ann = {ANN_GPU_MODELS: "|".join(sorted(s.models))} if s.models else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p{i}",
            "namespace": "default",
            "uid": f"uid-{i}",
            "resourceVersion": "1",
            "annotations": ann,
        },
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": requests, "limits": limits}}
            ],
        },
        "status": {"phase": "Pending"},
    }


def extender_shapes(stream: Sequence[Shape]) -> list[Shape]:
    """The shapes the extender reads from the pods `stream` becomes (what the simulator replays to compare)."""
    out = []
    for i, s in enumerate(stream):
        pod = pod_object(i, s)
        shape = shape_of(pod_spec(pod), pod, NOMINAL_GPU_MIB)
        assert shape is not None
        out.append(shape)
    return out


def nominal_nodes(nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
    """The nodes with 1000 MiB GPUs, as the extender sees them here."""
    return [NodeSpec(n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model, NOMINAL_GPU_MIB) for n in nodes]


def run(
    nodes: Sequence[NodeSpec],
    stream: Sequence[Shape],
    config: PackingConfig,
    step: Callable[[int], None] | None = None,
) -> list[tuple[int, tuple[int, ...]] | None]:
    """Replay `stream` through a fresh in-process extender; the (node row, GPU indices) of each pod or None."""
    ext = Extender(None, packing=config)
    for n in nodes:
        ext.view.apply_node(node_object(n))
    names = [n.name for n in nodes]
    row = {name: i for i, name in enumerate(names)}
    picks: list[tuple[int, tuple[int, ...]] | None] = []

    async def go() -> None:
        for i, s in enumerate(stream):
            pod = pod_object(i, s)
            ext.view.apply_pod(pod)  # the watch's ADDED event
            if s.gpus:
                args = {"Pod": pod, "Nodes": None, "NodeNames": names}
                ok = ext.filter(args)["NodeNames"]
                scores = ext.prioritize({"Pod": pod, "Nodes": None, "NodeNames": ok})
                best = max(scores, key=lambda h: h["Score"], default=None)  # the first on ties
                if best is None:
                    picks.append(None)
                else:
                    bind = {
                        "PodName": f"p{i}",
                        "PodNamespace": "default",
                        "PodUID": f"uid-{i}",
                        "Node": best["Host"],
                    }
                    res = await ext.bind(bind)
                    if res.get("Error"):
                        picks.append(None)
                    else:
                        held = ext.view.holdings[f"uid-{i}"]
                        picks.append((row[held.node], held.gpu_indices))
            else:
                shape = ext.shape(pod, None)
                assert shape is not None and ext.view.distribution is not None
                st = ext.view.packing_state()
                wl = ext.view.distribution.workload(st.models)
                rows = ext.view.packing_rows(names)
                scored = score_rows(st, rows, shape, wl, config.measure, config.quantize())
                if not len(scored.rows):
                    picks.append(None)
                else:
                    r = int(scored.rows[tessera_order(scored)[0]])
                    node = names[int(np.flatnonzero(ext.view.packing_rows(names) == r)[0])]
                    ext.view.apply_pod({**pod, "spec": {**pod["spec"], "nodeName": node}})
                    picks.append((row[node], ()))
            if step is not None:
                step(i)

    asyncio.run(go())
    return picks
