"""The handoff: a node gets one GPU pod at a time between bind and the agent's Allocate (issue 44).

The extender runs its real HTTP server and list+watch against the fake API server; binds are what
kube-scheduler sends. The agent's part is played by writing `tessera.io/allocated`, as the agent does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from tessera.api import contract
from tessera.extender.handoff import Handoffs, waiting_node

from .conftest import Env, node, pod, running_env
from .fake_apiserver import FakeApiServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def env(clock: Clock) -> AsyncIterator[Env]:
    async with running_env(
        FakeApiServer(), Handoffs(stale_s=60.0, clock=clock), handoff_wait_s=20.0
    ) as started:
        started.api.put_node(node("gpu-a", gpus=2))
        await started.settle(lambda: "gpu-a" in started.extender.view.nodes)
        yield started


def bind_args(name: str, node_name: str = "gpu-a") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node_name}


def allocate(env: Env, name: str) -> None:
    """What the node agent writes once Allocate served the pod."""
    p = env.api.pods[f"default/{name}"]
    p["metadata"]["annotations"][contract.ANN_ALLOCATED] = "GPU-x::0"
    env.api.put_pod(p)


async def test_a_second_gpu_pod_is_bound_only_once_the_first_is_allocated(env: Env) -> None:
    for name in ("a", "b"):
        env.api.put_pod(pod(name, memory=4000, compute=25))
    await env.settle(lambda: {"default/a", "default/b"} <= env.extender.view.pods.keys())
    assert (await env.post("bind", bind_args("a")))[1] == {"Error": ""}
    second = asyncio.create_task(env.post("bind", bind_args("b")))
    await env.settle(
        lambda: env.extender.handoffs is not None and env.extender.handoffs.blocker("gpu-a") is not None
    )
    await asyncio.sleep(0.3)  # the bind must still be waiting: nothing allocated a yet
    assert not second.done() and not env.api.pods["default/b"]["spec"].get("nodeName")
    allocate(env, "a")
    status, out = await asyncio.wait_for(second, 30)
    assert (status, out) == (200, {"Error": ""})
    assert env.api.pods["default/b"]["spec"]["nodeName"] == "gpu-a"


async def test_a_bind_refused_while_the_node_is_busy_is_retried_once_it_is_handed_on() -> None:
    async with running_env(FakeApiServer(), Handoffs(stale_s=60.0), handoff_wait_s=0.2) as env:
        env.api.put_node(node("gpu-a", gpus=2))
        for name in ("a", "b"):
            env.api.put_pod(pod(name, memory=4000, compute=25))
        await env.settle(lambda: {"default/a", "default/b"} <= env.extender.view.pods.keys())
        assert (await env.post("bind", bind_args("a")))[1] == {"Error": ""}
        _, out = await env.post("bind", bind_args("b"))
        assert "cannot bind default/b to gpu-a yet: pod default/a bound there still waits" in out["Error"]
        assert not env.api.pods["default/b"]["spec"].get("nodeName")

        def retried() -> bool:
            return contract.ANN_RETRY in (env.api.pods["default/b"]["metadata"].get("annotations") or {})

        await asyncio.sleep(0.3)
        assert not retried()
        allocate(env, "a")
        await env.settle(retried)
        assert (await env.post("bind", bind_args("b")))[1] == {"Error": ""}


@pytest.mark.parametrize("ending", ["finished", "deleted", "being deleted"])
async def test_a_waiting_pod_that_ends_hands_its_node_on(env: Env, ending: str) -> None:
    for name in ("a", "b"):
        env.api.put_pod(pod(name, memory=4000, compute=25))
    await env.settle(lambda: {"default/a", "default/b"} <= env.extender.view.pods.keys())
    assert (await env.post("bind", bind_args("a")))[1] == {"Error": ""}
    second = asyncio.create_task(env.post("bind", bind_args("b")))
    await asyncio.sleep(0.2)
    assert not second.done()
    a = env.api.pods["default/a"]
    if ending == "finished":
        a["status"]["phase"] = "Failed"  # e.g. the kubelet refused its admission
        env.api.put_pod(a)
    elif ending == "deleted":
        env.api.delete_pod("default/a")
    else:
        a["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        env.api.put_pod(a)
    assert (await asyncio.wait_for(second, 30))[1] == {"Error": ""}


async def test_other_nodes_and_cpu_pods_are_not_held_up(env: Env) -> None:
    env.api.put_node(node("gpu-b", gpus=1))
    for p in (pod("a"), pod("b"), {**pod("cpu"), "spec": {"containers": [{"name": "c"}]}}):
        env.api.put_pod(p)
    await env.settle(lambda: "gpu-b" in env.extender.view.nodes and len(env.extender.view.pods) == 3)
    assert (await env.post("bind", bind_args("a")))[1] == {"Error": ""}
    started = time.monotonic()
    assert (await env.post("bind", bind_args("b", "gpu-b")))[1] == {"Error": ""}
    assert (await env.post("bind", bind_args("cpu")))[1] == {"Error": ""}
    assert time.monotonic() - started < 15  # neither waited for gpu-a's handoff (20 s)


async def test_a_pod_never_allocated_stops_holding_its_node_after_the_stale_time(
    env: Env, clock: Clock
) -> None:
    for name in ("a", "b"):
        env.api.put_pod(pod(name, memory=4000, compute=25))
    await env.settle(lambda: {"default/a", "default/b"} <= env.extender.view.pods.keys())
    assert (await env.post("bind", bind_args("a")))[1] == {"Error": ""}
    second = asyncio.create_task(env.post("bind", bind_args("b")))
    await asyncio.sleep(0.2)
    assert not second.done()
    clock.now += 61  # a's kubelet never admitted it
    assert (await asyncio.wait_for(second, 30))[1] == {"Error": ""}


async def test_a_restarted_extender_learns_the_waiting_pods_from_its_list(clock: Clock) -> None:
    api = FakeApiServer()
    api.put_node(node("gpu-a", gpus=2))
    waiting = pod("a", annotations={contract.ANN_ASSIGNMENT: "{}"})
    waiting["spec"]["nodeName"] = "gpu-a"
    api.put_pod(waiting)
    api.put_pod(pod("b"))
    async with running_env(api, Handoffs(stale_s=60.0, clock=clock), handoff_wait_s=0.2) as env:
        await env.settle(lambda: len(env.extender.view.pods) == 2)
        _, out = await env.post("bind", bind_args("b"))
        assert "pod default/a bound there still waits" in out["Error"]


def test_which_pods_wait() -> None:
    p = pod("a", annotations={contract.ANN_ASSIGNMENT: "{}"})
    assert waiting_node(p) is None  # not bound yet
    p["spec"]["nodeName"] = "n"
    assert waiting_node(p) == "n"
    assert waiting_node({**p, "status": {"phase": "Succeeded"}}) is None
    allocated = pod("a", annotations={contract.ANN_ASSIGNMENT: "{}", contract.ANN_ALLOCATED: "x::0"})
    allocated["spec"]["nodeName"] = "n"
    assert waiting_node(allocated) is None
    plain = pod("c")
    plain["spec"]["nodeName"] = "n"
    assert waiting_node(plain) is None  # no assignment: not a lane pod (CPU pods, DRA claims)
    with pytest.raises(ValueError, match="stale time must be positive"):
        Handoffs(stale_s=0)


def test_a_view_from_before_the_bind_does_not_hand_the_node_on(clock: Clock) -> None:
    """Found on the real node under load: the watch delivered the pod as it was between the extender's
    assignment patch and its Binding (annotated, no nodeName) after the bind had been recorded, and that older
    view cleared the handoff, so the next pod was bound at once and the agent refused an ambiguous Allocate."""
    h = Handoffs(stale_s=60.0, clock=clock)
    h.bound("gpu-a", "uid-a", "default/a")
    before_bind = pod("a", annotations={contract.ANN_ASSIGNMENT: "{}"})  # assigned, not yet bound
    before_bind["metadata"]["uid"] = "uid-a"
    assert h.observe(before_bind) is None
    blocker = h.blocker("gpu-a")
    assert blocker is not None and blocker.uid == "uid-a"
    h.replace([before_bind])  # a relist listed before the bind says no more
    assert h.blocker("gpu-a") is not None
    served = pod("a", annotations={contract.ANN_ASSIGNMENT: "{}", contract.ANN_ALLOCATED: "GPU-x::0"})
    served["metadata"]["uid"] = "uid-a"
    served["spec"]["nodeName"] = "gpu-a"
    assert h.observe(served) == "gpu-a" and h.blocker("gpu-a") is None  # the agent's mark hands it on
    h.bound("gpu-a", "uid-b", "default/b")
    gone = pod("b", annotations={contract.ANN_ASSIGNMENT: "{}"})
    gone["metadata"]["uid"] = "uid-b"
    gone["metadata"]["deletionTimestamp"] = "2026-11-29T08:00:00Z"
    assert h.observe(gone) == "gpu-a"  # a pod being deleted stops waiting, bound or not


def top(scores: list[dict[str, object]]) -> str:
    return str(max(scores, key=lambda h: int(str(h["Score"])))["Host"])


async def test_prioritize_ranks_a_node_another_gpu_pod_holds_last(clock: Clock) -> None:
    """Pods arriving faster than the agent's Allocates (the scale bench, 300 pods at 50/s): kube-scheduler
    ranked the same best node first for each, and their binds queued behind one another's handoff until
    kube-scheduler's 5 s httpTimeout cut them (239 of 300 binds timed out once). A node promised to a pod by
    prioritize, or holding a pod that waits for its Allocate, now ranks last for the others, unless no other
    node is left."""
    async with running_env(FakeApiServer(), Handoffs(stale_s=60.0, clock=clock), handoff_wait_s=20.0) as env:
        for name in ("gpu-a", "gpu-b"):
            env.api.put_node(node(name, gpus=2))
        for name in ("a", "b", "c"):
            env.api.put_pod(pod(name, memory=4000, compute=25))
        await env.settle(
            lambda: (
                {"gpu-a", "gpu-b"} <= env.extender.view.nodes.keys()
                and {"default/a", "default/b", "default/c"} <= env.extender.view.pods.keys()
            )
        )
        names = ["gpu-a", "gpu-b"]

        async def ranks(name: str, candidates: list[str] = names) -> list[dict[str, object]]:
            status, out = await env.post(
                "prioritize", {"Pod": env.api.pods[f"default/{name}"], "NodeNames": candidates}
            )
            assert status == 200, out
            return list(out)

        first = top(await ranks("a"))
        other = next(n for n in names if n != first)
        # b before a's bind reached the extender: the node promised to a ranks last
        second = await ranks("b")
        assert top(second) == other
        assert {h["Host"]: h["Score"] for h in second}[first] == 0
        assert env.extender.handoffs is not None
        env.extender.handoffs.settle("uid-b")  # b's bind ended (refused, say): its node is free again
        # a bound there and waiting for its Allocate: still held
        assert (await env.post("bind", bind_args("a", first)))[1] == {"Error": ""}
        assert top(await ranks("c")) == other
        # the only candidate: ranked as before (the bind will wait for the handoff rather than no node at all)
        assert int(str((await ranks("c", [first]))[0]["Score"])) > 0
        # a allocated: the node is free for c again
        allocate(env, "a")
        await env.settle(
            lambda: env.extender.handoffs is not None and not env.extender.handoffs.blocker(first)
        )
        env.extender.handoffs.settle("uid-c")
        assert top(await ranks("c")) == first


def test_promises_are_forgotten_when_their_node_is_promised_again(clock: Clock) -> None:
    """Pods prioritized but never bound must not pile up in the promise book (one entry per node at most)."""
    h = Handoffs(stale_s=60.0, clock=clock)
    for i in range(100):
        h.promise("gpu-a", f"uid-{i}")
        clock.now += 10  # past promise_s: the next pod may take the node
    assert len(h._promise_of) == 1 and len(h._promised) == 1
    assert h.busy_nodes("uid-x") == set()  # the last promise is past promise_s too: settled on the way
    assert not h._promise_of and not h._promised
