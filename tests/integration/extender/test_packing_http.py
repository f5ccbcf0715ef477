"""The extender with FGD's rule over real HTTP: CPU, memory and GPU-model fit in filter, the node and GPU of
least fragmentation growth at the top of prioritize, and bind taking that GPU."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.extender.server import Extender, make_app
from tessera.extender.view import ANN_GPU_MODELS
from tessera.policy.lanes.fragmentation import Shape
from tessera.policy.lanes.packing import PackingConfig
from tessera.policy.lanes.placement import PlacementConfig


def node(name: str, gpus: int, model: str, cpu: str = "64", memory: str = "256Gi") -> dict[str, Any]:
    inv = [GpuInfo(uuid=f"{name}-{i}", index=i, model=model, memory_mib=1000) for i in range(gpus)]
    return {
        "metadata": {"name": name, "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}},
    }


def pod(
    name: str, milli: int, cpu: str = "1", memory: str = "1Gi", models: str | None = None
) -> dict[str, Any]:
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: str(milli),
        contract.RESOURCE_GPU_COMPUTE: str(milli // 10),
    }
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {ANN_GPU_MODELS: models} if models else {},
        },
        "spec": {
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}}
            ]
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
async def served() -> AsyncIterator[tuple[Extender, str]]:
    # the prior: the workload is half-GPU pods
    ext = Extender(None, config=PlacementConfig(packing=True))
    ext.packing = PackingConfig(prior=((Shape(1, 0.5, 500.0), 100.0),))
    ext.view.distribution = ext.packing.distribution()
    runner = web.AppRunner(make_app(ext))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield ext, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def post(url: str, verb: str, body: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/{verb}", json=body) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_filter_honours_cpu_memory_and_gpu_model(served: tuple[Extender, str]) -> None:
    ext, url = served
    for n in (node("t4", 2, "T4"), node("small", 2, "T4", cpu="2", memory="4Gi"), node("v100", 2, "V100M32")):
        ext.view.apply_node(n)
    out = await post(
        url, "filter", {"Pod": pod("a", 300, cpu="4", memory="8Gi"), "NodeNames": ["t4", "small", "v100"]}
    )
    assert out["NodeNames"] == ["t4", "v100"]
    assert "2000m CPU free, pod needs 4000m" in out["FailedNodes"]["small"]
    out = await post(
        url, "filter", {"Pod": pod("b", 300, models="V100M32|A100"), "NodeNames": ["t4", "v100"]}
    )
    assert out["NodeNames"] == ["v100"]
    assert "pod wants A100|V100M32" in out["FailedNodes"]["t4"]


async def test_tight_looking_node_that_fragments_more_loses(served: tuple[Extender, str]) -> None:
    """n-half has a GPU half used (best-fit's pick for a 0.3-GPU pod); there the pod leaves 0.2 that no
    half-GPU pod can use. On n-idle's GPU it leaves 0.7, and the other GPU keeps a usable 0.5: n-idle wins,
    and bind takes the GPU prioritize scored."""
    ext, url = served
    ext.view.apply_node(node("n-half", 1, "T4"))
    ext.view.apply_node(node("n-idle", 1, "T4"))
    first = pod("first", 500)
    ext.view.apply_pod(first)
    res = await post(
        url, "bind", {"PodName": "first", "PodNamespace": "default", "PodUID": "uid-first", "Node": "n-half"}
    )
    assert res == {"Error": ""}
    p = pod("small", 300)
    ext.view.apply_pod(p)
    out = await post(url, "filter", {"Pod": p, "NodeNames": ["n-half", "n-idle"]})
    assert out["NodeNames"] == ["n-half", "n-idle"]
    scores = {
        h["Host"]: h["Score"]
        for h in await post(url, "prioritize", {"Pod": p, "NodeNames": out["NodeNames"]})
    }
    assert scores["n-idle"] == 10 and scores["n-half"] < 10
    res = await post(
        url, "bind", {"PodName": "small", "PodNamespace": "default", "PodUID": "uid-small", "Node": "n-idle"}
    )
    assert res == {"Error": ""}
    assert ext.view.holdings["uid-small"].node == "n-idle"
    # CPU and memory of bound pods count on their node
    assert ext.view.node_free("n-idle") == (64000 - 1000, 256 * 1024 - 1024)


def cpu_pod(name: str, cpu: str) -> dict[str, Any]:
    res = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"containers": [{"name": "c", "resources": res}]},
        "status": {"phase": "Pending"},
    }


async def test_a_cpu_only_pod_is_packed_by_the_rule_too(served: tuple[Extender, str]) -> None:
    """kube-scheduler sends every pod of the profile (the extender names no managed resources). A 6-CPU pod
    on gpu-8 (8 CPUs) would leave 2, too few for the half-GPU pods the cluster runs (4 CPUs each): its GPU
    would strand. gpu-16 keeps 10 CPUs and stays usable, so it gets the top priority; a node without GPUs
    comes first when it has room; bind counts the CPU and writes no lane."""
    ext, url = served
    ext.packing = PackingConfig(prior=((Shape(1, 0.5, 500.0, cpu_milli=4000), 100.0),))
    ext.view.distribution = ext.packing.distribution()
    ext.view.apply_node(node("gpu-8", 1, "T4", cpu="8"))
    ext.view.apply_node(node("gpu-16", 1, "T4", cpu="16"))
    ext.view.apply_node(
        {"metadata": {"name": "cpu-4"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}
    )
    names = ["gpu-8", "gpu-16", "cpu-4"]
    small = cpu_pod("small", "3")
    out = await post(url, "filter", {"Pod": small, "NodeNames": names})
    assert out["NodeNames"] == names
    scores = {
        h["Host"]: h["Score"] for h in await post(url, "prioritize", {"Pod": small, "NodeNames": names})
    }
    assert scores["cpu-4"] == 10 and max(scores["gpu-8"], scores["gpu-16"]) < 10

    big = cpu_pod("big", "6")
    ext.view.apply_pod(big)
    out = await post(url, "filter", {"Pod": big, "NodeNames": names})
    assert out["NodeNames"] == ["gpu-8", "gpu-16"]
    assert "4000m CPU free, pod needs 6000m" in out["FailedNodes"]["cpu-4"]
    scores = {
        h["Host"]: h["Score"]
        for h in await post(url, "prioritize", {"Pod": big, "NodeNames": out["NodeNames"]})
    }
    assert scores == {"gpu-16": 10, "gpu-8": 0}
    res = await post(
        url, "bind", {"PodName": "big", "PodNamespace": "default", "PodUID": "uid-big", "Node": "gpu-16"}
    )
    assert res == {"Error": ""}
    assert "uid-big" not in ext.view.holdings  # no GPU, no lane
    assert ext.view.node_free("gpu-16") == (16000 - 6000, 256 * 1024 - 1024)
    # capacity gone: a second bind of a pod that no longer fits is refused with the reason
    huge = cpu_pod("huge", "12")
    ext.view.apply_pod(huge)
    res = await post(
        url, "bind", {"PodName": "huge", "PodNamespace": "default", "PodUID": "uid-huge", "Node": "gpu-16"}
    )
    assert "10000m CPU free, pod needs 12000m" in res["Error"]
