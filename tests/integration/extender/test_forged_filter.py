"""A /filter body cannot decide what /bind does for a pod the API server knows differently.

A forged filter request names a real pod's uid and resourceVersion (and its annotations) but asks for
something else: fewer GPUs, less GPU memory, no GPU model. Bind reads the pod as the API server holds it,
and the real pod's own filter and prioritize are answered from its own body, whatever came before.
"""

from __future__ import annotations

import copy
from typing import Any

from tessera.api import contract
from tessera.api.assignment import Assignment

from .conftest import Env, node, pod


async def _real(env: Env, real: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """`real` created on the API server and `nodes` listed; the pod as the watch holds it."""
    for n in nodes:
        env.api.put_node(n)
    env.api.put_pod(real)
    key = f"default/{real['metadata']['name']}"
    await env.settle(lambda: len(env.extender.view.nodes) == len(nodes) and key in env.extender.view.pods)
    return copy.deepcopy(env.extender.view.pods[key])


def _forged(real: dict[str, Any], **change: Any) -> dict[str, Any]:
    """`real` (same uid, resourceVersion and annotations) with a different request."""
    fake = pod(real["metadata"]["name"], **change)
    fake["metadata"] = copy.deepcopy(real["metadata"])
    return fake


def _bind_args(real: dict[str, Any], to: str) -> dict[str, Any]:
    meta = real["metadata"]
    return {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": to}


async def test_bind_takes_the_gpu_count_from_the_api_server_not_a_forged_filter(env: Env) -> None:
    real = await _real(env, pod("two", memory=4000, compute=25, gpus=2), [node("gpu-a", gpus=2)])
    status, _ = await env.post("filter", {"Pod": _forged(real, gpus=1), "NodeNames": ["gpu-a"]})
    assert status == 200
    status, out = await env.post("bind", _bind_args(real, "gpu-a"))
    assert status == 200 and out["Error"] == ""
    ann = env.api.pods["default/two"]["metadata"]["annotations"][contract.ANN_ASSIGNMENT]
    assert Assignment.parse(ann).gpu_indices == [0, 1]


async def test_bind_refuses_what_only_the_forged_request_fits(env: Env) -> None:
    real = await _real(env, pod("big", memory=12000), [node("small", gpus=1, memory_mib=8000)])
    _, out = await env.post("filter", {"Pod": _forged(real, memory=1000), "NodeNames": ["small"]})
    assert out["NodeNames"] == ["small"]  # the forged body is answered for what it says
    status, out = await env.post("bind", _bind_args(real, "small"))
    assert status == 200
    assert "8000 MiB free, pod needs 12000" in out["Error"]
    assert contract.ANN_ASSIGNMENT not in env.api.pods["default/big"]["metadata"]["annotations"]
    assert not env.extender.view.holdings


async def test_bind_keeps_the_gpu_model_the_real_pod_asks_for(env: Env) -> None:
    wants_v100 = pod("v100", annotations={contract.ANN_GPU_MODELS: "V100"})
    real = await _real(env, wants_v100, [node("p100", gpus=1)])
    forged = _forged(real)
    del forged["metadata"]["annotations"][contract.ANN_GPU_MODELS]
    _, out = await env.post("filter", {"Pod": forged, "NodeNames": ["p100"]})
    assert out["NodeNames"] == ["p100"]
    status, out = await env.post("bind", _bind_args(real, "p100"))
    assert status == 200 and "pod wants V100" in out["Error"]
    assert not env.extender.view.holdings


async def test_the_real_pods_filter_and_prioritize_are_not_poisoned(env: Env) -> None:
    real = await _real(env, pod("big", memory=12000), [node("small", gpus=1, memory_mib=8000), node("gpu-a")])
    names = ["small", "gpu-a"]
    await env.post("filter", {"Pod": _forged(real, memory=1000), "NodeNames": names})
    _, out = await env.post("filter", {"Pod": real, "NodeNames": names})
    assert out["NodeNames"] == ["gpu-a"] and "pod needs 12000" in out["FailedNodes"]["small"]
    # a forged filter between the real filter and prioritize does not change the real pod's scores
    _, before = await env.post("prioritize", {"Pod": real, "NodeNames": names})
    await env.post("filter", {"Pod": _forged(real, memory=100_000), "NodeNames": names})
    _, after = await env.post("prioritize", {"Pod": real, "NodeNames": names})
    assert after == before and {s["Host"]: s["Score"] for s in after}["small"] == 0
    assert {s["Host"]: s["Score"] for s in after}["gpu-a"] > 0
