"""The extender's /metrics after real HTTP filter, prioritize and bind calls (issue 10)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from tessera.api import metrics_catalog as catalog
from tessera.extender.metrics import make_metrics_app

from .conftest import Env, node, pod

MIB = 1024 * 1024
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
async def metrics_url(env: Env) -> AsyncIterator[str]:
    server = TestServer(make_metrics_app(env.extender.metrics, env.extender.view))
    await server.start_server()
    try:
        yield str(server.make_url("/metrics"))
    finally:
        await server.close()


async def _scrape(env: Env, url: str) -> Samples:
    async with env.http.get(url) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_follow_filter_prioritize_and_bind(env: Env, metrics_url: str) -> None:
    env.api.put_node(node("gpu-a"))  # two 16000 MiB GPUs
    env.api.put_node(node("gpu-b", gpus=1, memory_mib=8000))
    env.api.put_node(node("cpu-only", annotate=False))
    await env.settle(
        lambda: len(env.extender.view.nodes) == 2 and "cpu-only" in env.extender.view.node_errors
    )

    first = pod("first", memory=6000, compute=40)
    second = pod("second", memory=6000, compute=40)
    for p in (first, second):
        env.api.put_pod(p)
    await env.settle(lambda: len(env.extender.view.pods) == 2)

    names = ["gpu-a", "gpu-b", "cpu-only", "ghost"]
    _, out = await env.post("filter", {"Pod": first, "NodeNames": names})
    assert out["NodeNames"] == ["gpu-a", "gpu-b"]
    status, _ = await env.post("prioritize", {"Pod": first, "NodeNames": out["NodeNames"]})
    assert status == 200
    # The scheduler picks gpu-b for both pods (both passed filter before either bound): one wins.
    bind = {"PodNamespace": "default", "PodName": "first", "PodUID": "uid-first", "Node": "gpu-b"}
    assert (await env.post("bind", bind))[1] == {"Error": ""}
    lost = {"PodNamespace": "default", "PodName": "second", "PodUID": "uid-second", "Node": "gpu-b"}
    assert "2000 MiB free" in (await env.post("bind", lost))[1]["Error"]
    gone = {"PodNamespace": "default", "PodName": "ghost", "PodUID": "uid-ghost", "Node": "gpu-a"}
    assert "not found" in (await env.post("bind", gone))[1]["Error"]
    assert (await env.post("filter", {"Pod": "not a pod"}))[0] == 400

    samples = await _scrape(env, metrics_url)

    # Latency histograms by verb: one observation per call.
    count = "tessera_extender_request_duration_seconds_count"
    assert _value(samples, count, verb="filter") == 2
    assert _value(samples, count, verb="prioritize") == 1
    assert _value(samples, count, verb="bind") == 3
    assert _value(samples, "tessera_extender_request_duration_seconds_sum", verb="bind") > 0
    requests = "tessera_extender_requests_total"
    assert _value(samples, requests, verb="filter", result="ok") == 1
    assert _value(samples, requests, verb="filter", result="error") == 1
    assert _value(samples, requests, verb="bind", result="ok") == 1
    assert _value(samples, requests, verb="bind", result="error") == 2

    binds = "tessera_extender_binds_total"
    assert _value(samples, binds, outcome="ok", reason="none") == 1
    assert _value(samples, binds, outcome="lost_race", reason="no_fit") == 1
    assert _value(samples, binds, outcome="error", reason="pod_not_found") == 1

    # cpu-only has no inventory annotation; ghost is unknown to the view.
    assert _value(samples, "tessera_extender_rejected_nodes_total", reason="no_inventory") == 2

    # Allocated side of the Utilisation dashboard: what bind reserved, per GPU of the view.
    memory = "tessera_gpu_memory_allocated_bytes"
    assert _value(samples, memory, node="gpu-b", gpu="0") == 6000 * MIB
    assert _value(samples, "tessera_gpu_compute_allocated_ratio", node="gpu-b", gpu="0") == pytest.approx(0.4)
    assert (memory, frozenset({("node", "gpu-a"), ("gpu", "1")})) in samples
    assert _value(samples, memory, node="gpu-a", gpu="1") == 0

    # Every tessera_* series served is a catalogue entry of the extender.
    exported = {
        catalog.base_name(name)
        for name, _ in samples
        if name.startswith("tessera_") and not name.endswith("_created")  # client-added timestamps
    }
    extender_names = {s.name for s in catalog.for_component("extender")}
    assert exported <= extender_names
    assert extender_names - exported == set(), "an extender catalogue metric was never written"

    # A pod that finishes gives its GPU back; the gauge follows the view on the next scrape.
    env.api.put_pod({**first, "status": {"phase": "Succeeded"}})
    await env.settle(lambda: "uid-first" not in env.extender.view.holdings)
    samples = await _scrape(env, metrics_url)
    assert _value(samples, memory, node="gpu-b", gpu="0") == 0


async def test_filter_counts_rejections_by_reason_code(env: Env, metrics_url: str) -> None:
    env.api.put_node(node("gpu-a"))
    env.api.put_node(node("gpu-b", gpus=1, memory_mib=8000))
    await env.settle(lambda: len(env.extender.view.nodes) == 2)
    await env.post("filter", {"Pod": pod("big", memory=12000), "NodeNames": ["gpu-a", "gpu-b"]})
    bad = pod("bad", compute=250)
    await env.post("filter", {"Pod": bad, "NodeNames": ["gpu-a", "gpu-b"]})
    samples = await _scrape(env, metrics_url)
    rejected = "tessera_extender_rejected_nodes_total"
    assert _value(samples, rejected, reason="no_fit") == 1
    assert _value(samples, rejected, reason="bad_request") == 2
