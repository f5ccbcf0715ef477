"""The extender's view follows the API server through list+watch: changes made between its list and its
watch, watches the server closes, and watches that expire (410 Gone) while pods are deleted."""

from __future__ import annotations

import asyncio

from tessera.api import contract

from .conftest import Env, node, pod, running_env
from .fake_apiserver import FakeApiServer


async def _bound(env: Env, name: str, node_name: str) -> None:
    """Bind `name` (already in the fake) through the extender, so the view holds its GPUs."""
    await env.settle(lambda: f"default/{name}" in env.extender.view.pods)
    args = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node_name}
    assert (await env.post("bind", args))[1] == {"Error": ""}
    assert f"uid-{name}" in env.extender.view.holdings


async def test_a_change_between_list_and_watch_reaches_the_view() -> None:
    """A pod created after the extender's list, before its watch opens, arrives through the watch (the
    watch starts from the list's resourceVersion); the fake used to drop it, the metrics test's flake."""
    api = FakeApiServer()
    api.put_node(node("gpu-a"))
    api.after_list["pods"] = lambda: api.put_pod(pod("late"))
    async with running_env(api) as env:
        await env.settle(lambda: "default/late" in env.extender.view.pods)
        assert api.lists["pods"] == 1  # through the first watch, not a relist


async def test_a_watch_the_server_closes_is_resumed(env: Env) -> None:
    env.api.put_node(node("gpu-a"))
    await env.settle(lambda: "gpu-a" in env.extender.view.nodes)
    await env.settle(lambda: env.api.open_watches("nodes") == 1 and env.api.open_watches("pods") == 1)
    # The server ends the node watch (its request timeout) and a node joins before any new watch is open.
    env.api.end_watches("nodes")
    env.api.put_node(node("gpu-b", gpus=1))
    await env.settle(lambda: "gpu-b" in env.extender.view.nodes)
    await env.settle(lambda: env.api.open_watches("nodes") == 1 and env.api.open_watches("pods") == 1)


async def test_a_pod_deleted_while_the_watch_is_expired_gives_its_gpu_back(env: Env) -> None:
    env.api.put_node(node("gpu-a", gpus=1, memory_mib=16000))
    await env.settle(lambda: "gpu-a" in env.extender.view.nodes)
    env.api.put_pod(pod("held", memory=12000, compute=50))
    await _bound(env, "held", "gpu-a")
    await env.settle(lambda: env.api.open_watches("pods") == 1)
    # The pod watch expires (410 Gone after a compaction) and the pod is deleted before any new watch opens:
    # only the relist can tell the view, which must then free the 12000 MiB.
    env.api.expire_watches("pods")
    env.api.delete_pod("default/held")
    await env.settle(lambda: "uid-held" not in env.extender.view.holdings)
    assert "default/held" not in env.extender.view.pods
    env.api.put_pod(pod("next", memory=12000, compute=50))
    await _bound(env, "next", "gpu-a")
    assert env.api.pods["default/next"]["spec"]["nodeName"] == "gpu-a"
    # The relist left one watch per kind open (the other watch is cancelled, not leaked).
    await env.settle(lambda: env.api.open_watches("nodes") == 1 and env.api.open_watches("pods") == 1)


async def test_relist_keeps_a_bind_that_raced_it(env: Env) -> None:
    """A hold taken while a list was in flight stays even if the list predates its pod."""
    env.api.put_node(node("gpu-a", gpus=1, memory_mib=16000))
    await env.settle(lambda: "gpu-a" in env.extender.view.nodes)
    view = env.extender.view
    mark = view.mark()
    env.api.put_pod(pod("racing", memory=8000, compute=50))
    await _bound(env, "racing", "gpu-a")
    view.replace_pods([], mark)  # a list requested at `mark`, before the pod existed
    assert "uid-racing" in view.holdings
    view.replace_pods([], view.mark())  # a list requested after the hold, without the pod: it is gone
    assert "uid-racing" not in view.holdings
    assert contract.ANN_ASSIGNMENT in env.api.pods["default/racing"]["metadata"]["annotations"]


async def test_stop_ends_the_sync_while_its_watches_are_open(env: Env) -> None:
    """On SIGTERM (`stop`) the extender returns at once, not when the server next closes a watch."""
    env.api.put_node(node("gpu-a"))
    await env.settle(lambda: env.api.open_watches("nodes") == 1 and env.api.open_watches("pods") == 1)
    env.stop.set()
    await asyncio.wait_for(env.sync, 30)  # the deadline bounds a failure only
    await env.settle(lambda: env.api.open_watches("nodes") == 0 and env.api.open_watches("pods") == 0)


async def test_a_pod_refused_everywhere_is_retried_once_its_view_frees_room_there(env: Env) -> None:
    """kube-scheduler retries a pod the extender refused on the next cluster event only, and its informers
    may see that event (a pod ending) before this view does; the retry answered from the older view then
    left the pod waiting (a real-cluster TrialGroup test: its pod unbound for 120 s after the last refusal).
    So once the view frees room on a node the pod was refused on, the extender bumps the pod's
    tessera.io/retry annotation, an update that makes kube-scheduler retry it."""
    env.api.put_node(node("gpu-a", gpus=1, memory_mib=16000))
    await env.settle(lambda: "gpu-a" in env.extender.view.nodes)
    env.api.put_pod(pod("held", memory=12000, compute=50))
    await _bound(env, "held", "gpu-a")
    env.api.put_pod(pod("next", memory=12000, compute=50))
    await env.settle(lambda: "default/next" in env.extender.view.pods)

    def retried() -> bool:
        return contract.ANN_RETRY in (env.api.pods["default/next"]["metadata"].get("annotations") or {})

    _, out = await env.post("filter", {"Pod": env.api.pods["default/next"], "NodeNames": ["gpu-a"]})
    assert out["NodeNames"] == [] and "pod needs 12000" in out["FailedNodes"]["gpu-a"]
    # Room elsewhere in the view, or nothing freed at all, asks for no retry.
    env.api.put_pod(pod("other", memory=1000, compute=10))
    await env.settle(lambda: "default/other" in env.extender.view.pods)
    env.api.delete_pod("default/other")
    await env.settle(lambda: "default/other" not in env.extender.view.pods)
    assert not retried()

    held = env.api.pods["default/held"]
    held["status"]["phase"] = "Succeeded"
    env.api.put_pod(held)
    await env.settle(retried)
    assert env.api.pods["default/next"]["metadata"]["annotations"][contract.ANN_RETRY].startswith("gpu-a ")
    _, out = await env.post("filter", {"Pod": env.api.pods["default/next"], "NodeNames": ["gpu-a"]})
    assert out["NodeNames"] == ["gpu-a"]
