"""/bind over real HTTP refuses a node the pod does not select (nodeSelector, required affinity, taints,
nodeName), writing nothing, and binds the node it does select; labels and taints come from the node watch."""

from __future__ import annotations

from typing import Any

from tessera.api import contract

from .conftest import Env, node, pod


def labelled(name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    n = node(name)
    n["metadata"]["labels"] = labels
    if taints is not None:
        n["spec"] = {"taints": taints}
    return n


def args(name: str, node_name: str) -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node_name}


def node_mismatches(env: Env) -> float:
    value = env.extender.metrics.registry.get_sample_value(
        "tessera_extender_binds_total", {"outcome": "error", "reason": "node_mismatch"}
    )
    return value or 0.0


async def _setup(env: Env, *pods: dict[str, Any]) -> None:
    env.api.put_node(labelled("gpu-a", {"zone": "a"}))
    env.api.put_node(labelled("gpu-b", {"zone": "b"}))
    for p in pods:
        env.api.put_pod(p)
    keys = [f"default/{p['metadata']['name']}" for p in pods]
    await env.settle(
        lambda: len(env.extender.view.nodes) == 2 and all(k in env.extender.view.pods for k in keys)
    )


async def test_bind_refuses_a_node_the_node_selector_excludes_and_binds_one_it_selects(env: Env) -> None:
    p = pod("zonal")
    p["spec"]["nodeSelector"] = {"zone": "a"}
    await _setup(env, p)

    status, out = await env.post("bind", args("zonal", "gpu-b"))
    assert status == 200
    assert out["Error"] == (
        "cannot bind default/zonal to gpu-b: node's labels do not match the pod's nodeSelector zone=a"
    )
    assert node_mismatches(env) == 1
    stored = env.api.pods["default/zonal"]
    assert contract.ANN_ASSIGNMENT not in stored["metadata"]["annotations"]
    assert not stored["spec"].get("nodeName") and env.api.bindings == []
    assert env.extender.view.holdings == {}  # no GPUs held for the refused bind

    status, out = await env.post("bind", args("zonal", "gpu-a"))
    assert status == 200 and out == {"Error": ""}
    assert env.api.pods["default/zonal"]["spec"]["nodeName"] == "gpu-a"
    assert contract.ANN_ASSIGNMENT in env.api.pods["default/zonal"]["metadata"]["annotations"]
    assert node_mismatches(env) == 1


async def test_bind_refuses_failed_affinity_and_untolerated_taints(env: Env) -> None:
    needs_b = pod("needs-b")
    needs_b["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
                ]
            }
        }
    }
    plain = pod("plain")
    await _setup(env, needs_b, plain)

    _, out = await env.post("bind", args("needs-b", "gpu-a"))
    assert "required node affinity" in out["Error"]

    # gpu-b is tainted through the watch: the plain pod (no toleration) may no longer bind there
    env.api.put_node(
        labelled("gpu-b", {"zone": "b"}, [{"key": "maint", "value": "1", "effect": "NoSchedule"}])
    )
    await env.settle(lambda: bool(env.extender.view.node_facts["gpu-b"].taints))
    _, out = await env.post("bind", args("plain", "gpu-b"))
    assert out["Error"] == (
        "cannot bind default/plain to gpu-b: node has taint maint=1:NoSchedule that the pod does not tolerate"
    )
    assert env.api.bindings == [] and node_mismatches(env) == 2
    assert all(contract.ANN_ASSIGNMENT not in p["metadata"]["annotations"] for p in env.api.pods.values())
    assert (await env.post("bind", args("plain", "gpu-a")))[1] == {"Error": ""}
