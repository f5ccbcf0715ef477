"""A real Prometheus scrapes the running components, and every dashboard query returns data (issue 10).

The scene, all on loopback:
- operator: the real kopf operator in-process against kmock (tests/integration/operator), with two Apps and a
  TrialGroup on one 4-GPU node, its registry served over HTTP as `tessera operator --metrics-port` does;
- extender: the real aiohttp server synced from the fake API server of tests/integration/extender, with
  filter, prioritize and bind calls, and its `/metrics` app (`tessera extender --metrics-port`);
- node agent: fake NVML (FakeGpuBackend) with two lane pods, LaneTelemetry sampling it and the device
  plugin's Allocate answering, its registry served as `tessera-agent --metrics-port` does;
- gateway: `tessera worker` and `tessera gateway` processes answering a few v2 inference requests.

Panels whose metric the running code cannot produce yet are listed in DEFERRED with the reason; they stay
covered by test_dashboard_queries.py (catalogue-filled exporters). Every other dashboard metric must appear
in the live scrape, so a dashboard naming a metric no code exports fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import kmock
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import start_http_server
from tessera.api import contract
from tessera.api import metrics_catalog as catalog
from tessera.extender.metrics import make_metrics_app
from tessera.extender.server import Extender, make_app
from tessera.kube import KubeClient, KubeConfig

from tests.requires import missing

from .conftest import StartPrometheus
from .prom_server import free_port
from .promql_scan import dashboard_metrics, dashboard_queries

ROOT = Path(__file__).resolve().parents[3]
NODE = "gpu-node-1"

# Dashboard metrics no running component writes yet, and why. Their panels are checked against
# catalogue-filled exporters in test_dashboard_queries.py; drop a name here once its code exports it.
DEFERRED: dict[str, str] = {}


def _load(name: str) -> ModuleType:
    """Another test directory's scene helpers (the test folders are packages)."""
    return importlib.import_module(name)


op = _load("tests.integration.operator.conftest")
fake_api = _load("tests.integration.extender.fake_apiserver")
gw = _load("tests.integration.gateway.gateway_harness")


# --- the components --------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def operator_on_kmock(api: Any) -> AsyncIterator[str]:
    op.setup_api(api)
    op.add_node(api, NODE, 4)
    api.objects[op.APPS, op.NS, "resnet"] = op.app_body("resnet", [op.job("j0", iters=100000, gpus=2)])
    api.objects[op.APPS, op.NS, "bert"] = op.app_body("bert", [op.job("j0", iters=50000, gpus=1)])
    api.objects[op.TGS, op.NS, "lr-sweep"] = op.tg_body(
        "lr-sweep", [op.trial("a", 200), op.trial("b", 100)], gpus=1
    )
    # A served model on a second node: the operator's replica gauge (tessera_serving_replicas).
    op.add_node(api, f"{NODE}-serving", 4)
    api.objects[op.MDS, op.NS, "resnet-serving"] = op.md_body("resnet-serving", 300)
    # A team Queue serving the namespace, guaranteed the whole cluster (the scene is divided as without
    # queues): the operator's tessera_queue_* gauges. kmock cannot list Namespaces: the label is fed in.
    queues = f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_QUEUE}"
    api.resources[queues] = kmock.ResourceInfo(
        kind="Queue", namespaced=False, verbs=op.ALL, subresources={"status"}
    )
    api.objects[queues, None, "ml-team"] = {
        "apiVersion": contract.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "ml-team", "uid": "uid-q", "resourceVersion": "1"},
        "spec": {"guaranteedGPUs": 8},
    }
    async with op.running_operator(api, queues=True) as ctl:
        ctl.queues.set_namespace(op.NS, {contract.LABEL_QUEUE: "ml-team"})
        port = free_port()
        server, _ = start_http_server(port, addr="127.0.0.1", registry=ctl.metrics.registry)
        try:
            gauge = ctl.metrics.gauge("tessera_queue_allocated_gpus")
            await op.wait_for(
                lambda: any(s.labels.get("queue") == "ml-team" for m in gauge.collect() for s in m.samples),
                20,
                "the Queue's gauges",
            )
            await op.wait_for(
                lambda: op.status_of(api, op.TGS, "lr-sweep").get("trialsRunning"), 20, "TrialGroup trials"
            )
            await op.wait_for(
                lambda: op.status_of(api, op.MDS, "resnet-serving").get("replicas"), 20, "serving replicas"
            )
            # A trial reports a loss with its progress: tessera_trialgroup_best_objective.
            trial_pod = next(iter(op.pods(api, **{contract.LABEL_TRIAL: "a"})))
            progress = json.dumps({"iterations": 20, "loss": 0.5})
            await op.set_pod_phase(api, trial_pod, "Running", **{contract.ANN_PROGRESS: progress})
            yield f"127.0.0.1:{port}"
        finally:
            server.shutdown()


def _pod(name: str, memory: int, compute: int) -> dict[str, Any]:
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: str(memory),
        contract.RESOURCE_GPU_COMPUTE: str(compute),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": {}},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


class ExtenderScene:
    def __init__(self, url: str, api: Any, http: aiohttp.ClientSession) -> None:
        self.url, self.api, self.http, self.n = url, api, http, 0

    async def traffic(self) -> None:
        """One scheduling cycle for a new pod: filter, prioritize, bind to the first node that fits."""
        self.n += 1
        pod = _pod(f"p{self.n}", memory=2000, compute=10)
        self.api.put_pod(pod)
        names = [NODE, "cpu-node"]
        async with self.http.post(f"{self.url}/filter", json={"Pod": pod, "NodeNames": names}) as r:
            ok = (await r.json())["NodeNames"]
        async with self.http.post(f"{self.url}/prioritize", json={"Pod": pod, "NodeNames": ok}):
            pass
        bind = {"PodNamespace": "ml", "PodName": f"p{self.n}", "PodUID": f"uid-p{self.n}", "Node": ok[0]}
        for _ in range(50):  # the view learns of the pod through its watch
            async with self.http.post(f"{self.url}/bind", json=bind) as r:
                if (await r.json())["Error"] == "":
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"bind of p{self.n} never succeeded")


@contextlib.asynccontextmanager
async def extender(http: aiohttp.ClientSession) -> AsyncIterator[tuple[str, ExtenderScene]]:
    from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus

    api = fake_api.FakeApiServer()
    inv = [GpuInfo(uuid=f"GPU-{NODE}-{i}", index=i, model="V100", memory_mib=16384) for i in range(2)]
    api.put_node({"metadata": {"name": NODE, "annotations": {contract.ANN_NODE_GPUS: dump_node_gpus(inv)}}})
    api.put_node({"metadata": {"name": "cpu-node", "annotations": {}}})
    api_server = TestServer(api.app())
    await api_server.start_server()
    kube = KubeClient(KubeConfig(str(api_server.make_url("")).rstrip("/")))
    ext = Extender(kube)
    ext_server = TestServer(make_app(ext))
    metrics_server = TestServer(make_metrics_app(ext.metrics, ext.view), host="127.0.0.1")
    await ext_server.start_server()
    await metrics_server.start_server()
    stop = asyncio.Event()
    sync = asyncio.create_task(ext.sync_forever(stop, retry_seconds=0.1))
    try:
        await op.wait_for(lambda: NODE in ext.view.nodes, 10, "extender view")
        scene = ExtenderScene(str(ext_server.make_url("")).rstrip("/"), api, http)
        yield f"127.0.0.1:{metrics_server.port}", scene
    finally:
        stop.set()
        sync.cancel()
        await asyncio.gather(sync, return_exceptions=True)
        await kube.close()
        await metrics_server.close()
        await ext_server.close()
        await api_server.close()


class AgentScene:
    """The node agent's telemetry and device plugin on fake NVML, two lanes on GPU 0."""

    def __init__(self, root: Path) -> None:
        from tessera_agent.config import AgentConfig
        from tessera_agent.gpus.fake_backend import FakeGpuBackend
        from tessera_agent.gpus.telemetry import LaneTelemetry
        from tessera_agent.kubelet.plugin import DevicePluginServicer
        from tessera_agent.metrics_factory import AgentMetrics
        from tessera_agent.pods import StaticPodSource, pod_info_from_manifest

        self.backend = FakeGpuBackend.uniform(2)
        self.gpu0 = self.backend.gpus()[0].uuid
        self.metrics = AgentMetrics()
        manifests = [
            self._lane_pod("worker-0", "g0-l1", 4096, 25),
            self._lane_pod("worker-1", "g0-l2", 8192, 50),
        ]
        self.pods = [pod_info_from_manifest(m) for m in manifests]
        owners = {101: "uid-worker-0", 201: "uid-worker-1"}
        self.backend.add_process(self.gpu0, 101, 3000, sm_util=20)
        self.backend.add_process(self.gpu0, 201, 6000, sm_util=45)
        self.backend.set_utilization(self.gpu0, 70)
        self.telemetry = LaneTelemetry(NODE, self.backend, self.metrics, resolve_pid=owners.get)
        cfg = AgentConfig(node_name=NODE, slots_per_gpu=4, mps_root=root / "mps")  # the lanes' directories
        # The extender hands a node one GPU pod at a time (its handoff), so the agent sees the next lane pod
        # only after the previous one is allocated.
        self.source = StaticPodSource(self.pods[:1])
        self.plugin = DevicePluginServicer(cfg, self.backend, self.source, self.metrics)
        self.allocated = 0

    def _lane_pod(self, name: str, lane: str, mib: int, pct: int) -> dict[str, Any]:
        a = {
            "node": NODE,
            "gpuUUIDs": [self.gpu0],
            "gpuIndices": [0],
            "laneId": lane,
            "memoryMiB": mib,
            "computePercent": pct,
        }
        return {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": f"uid-{name}",
                "annotations": {contract.ANN_ASSIGNMENT: json.dumps(a)},
            },
            "spec": {"containers": [{"name": "c", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
        }

    async def traffic(self) -> None:
        from tessera_agent.proto import api_pb2

        self.telemetry.update(self.pods)
        if self.allocated < len(self.pods):  # the kubelet's Allocate for the next lane pod
            ids = [f"{self.gpu0}::{self.allocated}"]
            req = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            )
            await self.plugin.Allocate(req, None)  # type: ignore[arg-type]
            self.allocated += 1
            self.source.pods.extend(self.pods[self.allocated : self.allocated + 1])


@contextlib.contextmanager
def agent_exporter(scene: AgentScene) -> Iterator[str]:
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=scene.metrics.registry)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def gateway(model: Path, tmp: Path) -> Iterator[str]:
    with gw.worker_process(model) as (worker, _):
        config = {
            "models": [
                {
                    "name": gw.MODEL,
                    "namespace": "ml",
                    "policy": "timeout",
                    "slo_s": 0.5,
                    "workers": [worker],
                    "mean_solo_s": 0.01,
                }
            ],
            "health_interval_s": 0.5,
        }
        with gw.gateway_process(config, tmp) as (url, _):
            yield url


async def gateway_traffic(http: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]]) -> None:
    async def one(body: dict[str, Any]) -> None:
        async with http.post(f"{url}/v2/models/{gw.MODEL}/infer", json=body) as r:
            assert r.status == 200, await r.text()

    await asyncio.gather(*(one(b) for b in bodies))


# --- the test --------------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_every_dashboard_query_returns_data_from_running_components(
    prometheus: StartPrometheus, kmock: Any, tmp_path: Path
) -> None:
    if shutil.which("prometheus") is None:  # pragma: no cover - the fixture skips first
        missing("prometheus binary not on PATH; install it with: bash hack/install-test-deps.sh")
    from tessera.gateway.demo_models import early_exit_model

    model = early_exit_model(tmp_path / "early_exit.onnx", width=gw.WIDTH)
    bodies = gw.payloads("short", 4, seed=1)
    async with aiohttp.ClientSession() as http, contextlib.AsyncExitStack() as stack:
        gateway_url = stack.enter_context(gateway(model, tmp_path))
        operator_target = await stack.enter_async_context(operator_on_kmock(kmock))
        extender_target, ext_scene = await stack.enter_async_context(extender(http))
        agent = AgentScene(tmp_path)
        agent_target = stack.enter_context(agent_exporter(agent))
        targets = {
            "tessera-operator": [operator_target],
            "tessera-extender": [extender_target],
            "tessera-agent": [agent_target],
            "tessera-gateway": [gateway_url.removeprefix("http://")],
        }

        async def traffic() -> None:
            await ext_scene.traffic()
            await agent.traffic()
            await gateway_traffic(http, gateway_url, bodies)

        await traffic()
        server = await asyncio.to_thread(prometheus, targets)
        await asyncio.to_thread(server.wait_for, f"count(up == 1) == {len(targets)}")
        # rate() needs two scrapes that saw the counters move: traffic between three scrapes of each job.
        for i in (2, 3):
            await asyncio.to_thread(
                server.wait_for, f"count(count_over_time(tessera_build_info[30s]) >= {i}) == {len(targets)}"
            )
            await traffic()
        await asyncio.to_thread(
            server.wait_for, f"count(count_over_time(tessera_build_info[30s]) >= 4) == {len(targets)}"
        )

        # What the live components export, as Prometheus saw it.
        names = await asyncio.to_thread(server.label_values, "__name__")
        live = {catalog.base_name(n) for n in names if n.startswith("tessera_")}

        empty, absent, checked = [], [], 0
        for dashboard, where, expr, promql in dashboard_queries():
            metrics = dashboard_metrics(expr)
            if metrics & DEFERRED.keys():
                continue
            checked += 1
            for name in metrics - live:
                absent.append(f"{dashboard} {where}: {name}")
            if not await asyncio.to_thread(server.query, promql):
                empty.append(f"{dashboard} {where}: {expr}")
        assert checked >= 35, f"only {checked} dashboard queries checked live"
        assert not absent, "dashboard metrics no running component exported:\n" + "\n".join(absent)
        assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

        # Values, not only presence: rho per App from the arbiter, the extender's allocation from its binds.
        rho = await asyncio.to_thread(server.query, "tessera_app_rho")
        assert {r["metric"]["app"] for r in rho} == {"resnet", "bert"}
        assert all(float(r["value"][1]) > 0 for r in rho)
        alloc = await asyncio.to_thread(
            server.query, f'sum(tessera_gpu_memory_allocated_bytes{{node="{NODE}"}})'
        )
        assert float(alloc[0]["value"][1]) == ext_scene.n * 2000 * 1024 * 1024


def test_deferred_panels_are_named_by_a_dashboard_and_in_the_catalogue() -> None:
    named = set().union(*(dashboard_metrics(expr) for _, _, expr, _ in dashboard_queries()))
    for name, why in DEFERRED.items():
        assert name in named, f"{name} is deferred ({why}) but no dashboard queries it: drop it from DEFERRED"
        catalog.get(name)
