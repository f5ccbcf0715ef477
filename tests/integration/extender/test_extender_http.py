"""The extender over real HTTP with kube-scheduler's JSON, its view synced from an API server."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.extender.view import pod_request
from tessera.policy.lanes.placement import Choice, GpuState, choose_gpus, to_priority

from .conftest import Env, node, pod


async def _setup(env: Env) -> None:
    env.api.put_node(node("gpu-a"))
    env.api.put_node(node("gpu-b", gpus=1, memory_mib=8000))
    env.api.put_node(node("cpu-only", annotate=False))
    await env.settle(
        lambda: len(env.extender.view.nodes) == 2 and "cpu-only" in env.extender.view.node_errors
    )


async def test_filter_names_why_each_node_was_rejected(env: Env) -> None:
    await _setup(env)
    big = pod("big", memory=12000, compute=50)
    status, out = await env.post(
        "filter", {"Pod": big, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b", "cpu-only", "ghost"]}
    )
    assert status == 200
    assert out["NodeNames"] == ["gpu-a"]
    assert out["Nodes"] is None and out["Error"] == "" and out["FailedAndUnresolvableNodes"] == {}
    assert "8000 MiB free, pod needs 12000" in out["FailedNodes"]["gpu-b"]
    assert contract.ANN_NODE_GPUS in out["FailedNodes"]["cpu-only"]
    assert contract.ANN_NODE_GPUS in out["FailedNodes"]["ghost"]


async def test_filter_without_node_cache_returns_node_objects(env: Env) -> None:
    await _setup(env)
    nodes = {"items": [node("gpu-a"), node("gpu-b", gpus=1, memory_mib=8000)]}
    status, out = await env.post("filter", {"Pod": pod("p", memory=12000), "Nodes": nodes, "NodeNames": None})
    assert status == 200 and out["NodeNames"] is None
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-a"]


async def test_filter_honours_the_placement_annotation(env: Env) -> None:
    await _setup(env)
    placed = pod(
        "placed", annotations={contract.ANN_PLACEMENT: json.dumps({"node": "gpu-a", "gpuIndices": [1]})}
    )
    _, out = await env.post("filter", {"Pod": placed, "NodeNames": ["gpu-a", "gpu-b"]})
    assert out["NodeNames"] == ["gpu-a"]
    assert "placed on node gpu-a" in out["FailedNodes"]["gpu-b"]


async def test_prioritize_scores_are_0_to_10(env: Env) -> None:
    await _setup(env)
    status, out = await env.post("prioritize", {"Pod": pod("p"), "NodeNames": ["gpu-a", "gpu-b", "cpu-only"]})
    assert status == 200
    assert [h["Host"] for h in out] == ["gpu-a", "gpu-b", "cpu-only"]
    assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in out)
    assert out[2]["Score"] == 0 and out[0]["Score"] > 0


async def test_bind_writes_the_assignment_then_binds(env: Env) -> None:
    await _setup(env)
    env.api.put_pod(
        pod(
            "train",
            memory=6000,
            compute=40,
            annotations={contract.ANN_PLACEMENT: '{"node":"gpu-a","gpuIndices":[1]}'},
        )
    )
    await env.settle(lambda: "default/train" in env.extender.view.pods)
    args = {"PodName": "train", "PodNamespace": "default", "PodUID": "uid-train", "Node": "gpu-a"}
    status, out = await env.post("bind", args)
    assert status == 200 and out == {"Error": ""}
    stored = env.api.pods["default/train"]
    assert stored["spec"]["nodeName"] == "gpu-a"
    a = Assignment.parse(stored["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert (a.node, a.gpu_indices, a.gpu_uuids) == ("gpu-a", [1], ["GPU-gpu-a-1"])
    assert (a.memory_mib, a.compute_percent, a.lane_id) == (6000, 40, "g1-l1")
    assert env.api.bindings[0]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}
    # The view now counts that memory: a second pod cannot take GPU 1 beyond what is left.
    _, out = await env.post(
        "filter",
        {
            "Pod": pod(
                "x", memory=12000, annotations={contract.ANN_PLACEMENT: '{"node":"gpu-a","gpuIndices":[1]}'}
            ),
            "NodeNames": ["gpu-a"],
        },
    )
    assert "10000 MiB free" in out["FailedNodes"]["gpu-a"]


async def test_malformed_requests_get_400_with_a_message(env: Env) -> None:
    async with env.http.post(f"{env.url}/filter", data=b"{not json") as resp:
        assert resp.status == 400 and "not JSON" in await resp.text()
    status, text = await env.post("prioritize", {"Pod": pod("p")})
    assert status == 400 and "NodeNames" in text
    status, text = await env.post("bind", {"PodName": "p"})
    assert status == 400 and "PodNamespace" in text


async def test_bind_of_an_unknown_pod_is_a_clear_error(env: Env) -> None:
    await _setup(env)
    status, out = await env.post(
        "bind", {"PodName": "ghost", "PodNamespace": "default", "PodUID": "u", "Node": "gpu-a"}
    )
    assert status == 200 and out == {"Error": "pod default/ghost not found"}


async def test_a_thousand_concurrent_binds_never_oversubscribe(env: Env) -> None:
    env.api.put_node(node("gpu-a", gpus=2, memory_mib=16000))
    for i in range(1000):
        env.api.put_pod(pod(f"p{i}", memory=3000, compute=10))
    await env.settle(lambda: len(env.extender.view.pods) == 1000 and "gpu-a" in env.extender.view.nodes)

    async def bind(i: int) -> dict[str, str]:
        args = {"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"uid-p{i}", "Node": "gpu-a"}
        status, out = await env.post("bind", args)
        assert status == 200
        return out  # type: ignore[no-any-return]

    results = await asyncio.gather(*(bind(i) for i in range(1000)))
    won = [r for r in results if r["Error"] == ""]
    lost = [r for r in results if r["Error"]]
    assert len(won) == 10  # ⌊16000 / 3000⌋ = 5 per GPU
    assert all("cannot bind" in r["Error"] and "MiB free" in r["Error"] for r in lost)
    used: dict[int, int] = defaultdict(int)
    for p in env.api.pods.values():
        raw = p["metadata"]["annotations"].get(contract.ANN_ASSIGNMENT)
        if raw:
            a = Assignment.parse(raw)
            for i in a.gpu_indices:
                used[i] += a.memory_mib
    assert len(env.api.bindings) == 10
    assert all(v <= 16000 for v in used.values()) and sum(used.values()) == 30000


async def test_deleted_pods_free_their_gpus(env: Env) -> None:
    await _setup(env)
    env.api.put_pod(
        pod("a", memory=8000, annotations={contract.ANN_PLACEMENT: '{"node":"gpu-b","gpuIndices":[0]}'})
    )
    await env.settle(lambda: "default/a" in env.extender.view.pods)
    _, out = await env.post(
        "bind", {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "gpu-b"}
    )
    assert out == {"Error": ""}
    assert env.extender.view.nodes["gpu-b"][0].used_memory == 8000
    env.api.delete_pod("default/a")
    await env.settle(lambda: env.extender.view.nodes["gpu-b"][0].used_memory == 0)


async def test_fast_paths_answer_as_choose_gpus_does_from_scratch(env: Env) -> None:
    """FitIndex filter, per-node memo and reused NodeNames rows against choose_gpus on bare GPU states."""
    for k in range(10):
        env.api.put_node(node(f"n{k}", gpus=(1, 2, 4, 8)[k % 4], memory_mib=(8000, 16000)[k % 2]))
    await env.settle(lambda: len(env.extender.view.nodes) == 10)
    names = [f"n{k}" for k in range(10)] + ["ghost"]
    lc = {contract.ANN_WORKLOAD: f"serving:{contract.CLASS_LATENCY_CRITICAL}"}
    shapes = [
        {"memory": 3000, "compute": 20},
        {"memory": 6000, "compute": 50, "annotations": {contract.ANN_PROFILE: "compute"}},
        {"memory": 8000, "compute": 100, "gpus": 2},
        {"memory": 2000, "compute": 30, "annotations": lc},
        {"memory": None, "compute": None},  # defaults per node: the per-node path
    ]
    bound = 0
    for i in range(40):
        p = pod(f"p{i}", **shapes[i % len(shapes)])  # type: ignore[arg-type]
        env.api.put_pod(p)
        await env.settle(lambda i=i: f"default/p{i}" in env.extender.view.pods)
        view, cfg = env.extender.view, env.extender.config
        expect: dict[str, Choice | str] = {}
        for n in names[:-1]:
            fresh = [GpuState(g.index, g.uuid, g.memory_mib, g.healthy, g.tenants) for g in view.nodes[n]]
            req = pod_request(p, view.min_memory(n))
            assert req is not None
            expect[n] = choose_gpus(fresh, req, cfg)
        _, out = await env.post("filter", {"Pod": p, "NodeNames": names})
        assert out["NodeNames"] == [n for n in names[:-1] if isinstance(expect[n], Choice)]
        assert {n: why for n, why in out["FailedNodes"].items() if n != "ghost"} == {
            n: e for n, e in expect.items() if isinstance(e, str)
        }
        assert "ghost" in out["FailedNodes"]
        _, scores = await env.post("prioritize", {"Pod": p, "NodeNames": out["NodeNames"]})
        want = {n: to_priority(e.score) for n, e in expect.items() if isinstance(e, Choice)}
        assert {h["Host"]: h["Score"] for h in scores} == want
        if want:
            best = max(want, key=lambda n: (want[n], n))
            args = {"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"uid-p{i}", "Node": best}
            _, res = await env.post("bind", args)
            assert res == {"Error": ""}
            bound += 1
    assert bound > 20  # the cluster filled: later pods were rejected on most nodes


async def test_quantities_are_read_in_canonical_form(env: Env) -> None:
    """`8k` (how the API server returns 8000) is 8000 MiB and `16Gi` is 16384 MiB; absurd values are refused
    with a reason on every node (200, not a 500 from an overflow), and bind refuses them too."""
    await _setup(env)  # gpu-a: two 16000 MiB GPUs; gpu-b: one 8000 MiB GPU
    _, out = await env.post("filter", {"Pod": pod("k", memory="8k"), "NodeNames": ["gpu-a", "gpu-b"]})
    assert out["NodeNames"] == ["gpu-a", "gpu-b"] and out["FailedNodes"] == {}
    _, out = await env.post("filter", {"Pod": pod("gi", memory="16Gi"), "NodeNames": ["gpu-a", "gpu-b"]})
    assert out["NodeNames"] == []
    assert "16000 MiB free, pod needs 16384" in out["FailedNodes"]["gpu-a"]

    refused = {
        "1e999": "more than 16777216 MiB",
        "0.5": "not a whole number of MiB",
        "-1": "negative",
        "abc": "not a Kubernetes quantity",
    }
    for i, (value, why) in enumerate(refused.items()):
        bad = pod(f"bad{i}", memory=value)  # a new uid: the extender caches a pod's parsed request by uid
        status, out = await env.post("filter", {"Pod": bad, "NodeNames": ["gpu-a", "gpu-b"]})
        assert status == 200 and out["NodeNames"] == [] and out["Error"] == ""
        for reason in out["FailedNodes"].values():
            assert (
                reason.startswith(f"default/bad{i}: {contract.RESOURCE_GPU_MEMORY} {value!r}")
                and why in reason
            )
        status, scores = await env.post("prioritize", {"Pod": bad, "NodeNames": ["gpu-a", "gpu-b"]})
        assert status == 200 and [s["Score"] for s in scores] == [0, 0]

    env.api.put_pod(pod("huge", memory="1e999"))
    await env.settle(lambda: "default/huge" in env.extender.view.pods)
    args = {"PodName": "huge", "PodNamespace": "default", "PodUID": "uid-huge", "Node": "gpu-a"}
    status, out = await env.post("bind", args)
    assert status == 200 and "more than 16777216 MiB" in out["Error"]
    assert "nodeName" not in env.api.pods["default/huge"]["spec"]


async def test_a_retried_bind_on_another_node_leaves_the_first_binding_alone(env: Env) -> None:
    # kube-scheduler retries a pod elsewhere when a bind outlives its httpTimeout; the late bind of the first
    # try must neither rewrite the assignment with a node the pod is not on nor free the GPUs it holds
    # (seen on the real scheduler under load: assignment n09, spec.nodeName n12).
    await _setup(env)
    env.api.put_pod(pod("retry", memory=6000, compute=40))
    await env.settle(lambda: "default/retry" in env.extender.view.pods)
    args = {"PodName": "retry", "PodNamespace": "default", "PodUID": "uid-retry"}
    first, second = await asyncio.gather(
        env.post("bind", {**args, "Node": "gpu-a"}), env.post("bind", {**args, "Node": "gpu-b"})
    )
    assert [first[1]["Error"] == "", second[1]["Error"] == ""].count(True) == 1, (first, second)
    stored = env.api.pods["default/retry"]
    a = Assignment.parse(stored["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert a.node == stored["spec"]["nodeName"]
    assert len(env.api.bindings) == 1
    assert [h.node for h in env.extender.view.holdings.values()] == [a.node]
