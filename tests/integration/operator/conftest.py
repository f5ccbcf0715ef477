"""Run the real kopf operator in-process against kmock's KubernetesEmulator (kopf's test emulator)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import kopf
import pytest
from tessera.api import contract
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import Controller, make_registry

from tests.integration.clock import ManualClock

NS = "ml"
APPS = f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_APP}"
TGS = f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_TRIALGROUP}"
MDS = f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_MODELDEPLOYMENT}"
PODS = "v1/pods"
NODES = "v1/nodes"
EVENTS = "v1/events"
PEERINGS = "kopf.dev/v1/kopfpeerings"
ALL = {"list", "watch", "get", "patch", "create", "delete"}


def setup_api(k: kmock.KubernetesEmulator) -> None:
    k.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs={"list", "watch", "get"}
    )
    k.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch", "get"}
    )
    for res, kind in ((APPS, "App"), (TGS, "TrialGroup"), (MDS, "ModelDeployment")):
        k.resources[res] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs=ALL, subresources={"status"})
    k.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs=ALL)
    k.resources[NODES] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs={"list", "watch", "get", "patch"}
    )
    k.resources[EVENTS] = kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"create", "list", "get"})
    k.resources["v1/services"] = kmock.ResourceInfo(kind="Service", namespaced=True, verbs=ALL)
    k.resources["v1/configmaps"] = kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs=ALL)
    k.resources["apps/v1/deployments"] = kmock.ResourceInfo(kind="Deployment", namespaced=True, verbs=ALL)
    k.resources[PEERINGS] = kmock.ResourceInfo(kind="KopfPeering", namespaced=True, verbs=ALL)


def add_node(k: kmock.KubernetesEmulator, name: str, gpus: int, memory_mib: int = 16384) -> None:
    inv = [
        {"uuid": f"GPU-{name}-{i}", "index": i, "model": "V100", "memoryMiB": memory_mib, "healthy": True}
        for i in range(gpus)
    ]
    k.objects[NODES, None, name] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)},
        },
    }


TEMPLATE = {"spec": {"containers": [{"name": "train", "image": "trainer:1", "command": ["python", "t.py"]}]}}


def app_body(name: str, jobs: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"template": TEMPLATE, "jobs": jobs, **spec},
    }


def job(name: str, iters: int = 1000, t: float = 1.0, gpus: int = 1) -> dict[str, Any]:
    return {"name": name, "iterTotal": iters, "iterTimeSerialSeconds": t, "maxGPUs": gpus}


def pods(k: kmock.KubernetesEmulator, **labels: str) -> dict[str, dict[str, Any]]:
    out = {}
    for (_res, _ns, name), obj in list(k.objects.items()):
        body = dict(obj)
        if body.get("kind") != "Pod":
            continue
        if body.get("metadata", {}).get("deletionTimestamp"):
            continue
        got = body.get("metadata", {}).get("labels", {})
        if all(got.get(key) == v for key, v in labels.items()):
            out[name] = body
    return out


async def wait_for(check: Callable[[], Any], timeout: float = 45.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy (never a fixed sleep). The deadline only bounds a
    failure: a passing wait returns as soon as the condition holds, so it is generous for loaded CI."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_operator(
    k: kmock.KubernetesEmulator,
    *,
    identity: str | None = None,
    token: str | None = None,
    liveness: str | None = None,
    **overrides: Any,
) -> AsyncIterator[Controller]:
    # Leases run on a ManualClock unless a test passes `clock=`: rounds then happen on events (an App
    # arrives, GPUs are freed) or when the test advances the clock past an expiry, never by accident.
    # `identity` is the kopf peer id; `token` a bearer token, so a test of two operators can tell whose
    # requests reached kmock (request headers) — both default to what a single operator needs. `liveness`
    # is kopf's health endpoint URL (`tessera operator --liveness`), off by default.
    # kmock serves no Queue kind unless a test registers it, and cannot list Namespaces (test_queues.py
    # feeds namespace labels itself).
    settings: dict[str, Any] = {
        "lease_s": 1.0,
        "tick_s": 0.1,
        "standalone": True,
        "preemption_grace_s": 5,
        "queues": False,
        "watch_namespaces": False,
    }
    settings.update(overrides)
    settings.setdefault("clock", ManualClock())
    config = OperatorConfig(**settings)
    conn = kopf.ConnectionInfo(server=str(k.url), insecure=True, token=token)
    registry, ctl = make_registry(config, conn)
    stop = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            clusterwide=True,
            stop_flag=stop,
            standalone=config.standalone,
            priority=config.priority,
            peering_name=config.peering_name if not config.standalone else None,
            identity=identity,  # type: ignore[arg-type]  # kopf types it as a NewType of str
            liveness_endpoint=liveness,
        )
    )
    try:
        yield ctl
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


@pytest.fixture
def api(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    setup_api(kmock)
    # The test's own requests close their connection: a keep-alive connection left open would be a task
    # kopf finds at shutdown and waits 5 s for ("hung tasks"), which made every test that talks HTTP slow.
    for client in kmock.clients:
        client.headers["Connection"] = "close"
    return kmock


def plain_gpu_pod(name: str, node: str, index: int) -> dict[str, Any]:
    """A pod Tessera did not create that holds a GPU (placed by the extender)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {contract.ANN_PLACEMENT: json.dumps({"node": node, "gpuIndices": [index]})},
        },
        "spec": {"containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    }


def tg_body(name: str, trials: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "TrialGroup",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"template": TEMPLATE, "trials": trials, **spec},
    }


def trial(name: str, iters: int, t: float = 1.0, **config: Any) -> dict[str, Any]:
    return {"name": name, "budgetIterations": iters, "iterTimeSeconds": t, "config": config}


def events(k: kmock.KubernetesEmulator, reason: str) -> list[dict[str, Any]]:
    return [dict(o) for _, o in list(k.objects.items()) if dict(o).get("reason") == reason]


def status_of(k: kmock.KubernetesEmulator, resource: str, name: str) -> dict[str, Any]:
    try:
        return dict(k.objects[resource, NS, name]).get("status") or {}
    except KeyError:
        return {}


async def set_pod_phase(k: kmock.KubernetesEmulator, name: str, phase: str, **annotations: str) -> None:
    """Move a pod the way the kubelet would (through the API, so the operator's watch sees it)."""
    body: dict[str, Any] = {"status": {"phase": phase}}
    if annotations:
        body["metadata"] = {"annotations": annotations}
    await k.patch(f"/api/v1/namespaces/{NS}/pods/{name}", json=body)


def md_body(name: str, rps: float, **spec: Any) -> dict[str, Any]:
    """A static model with a measured ℓ(b) (ms at batch 1, 2, 4, 8) and a 100 ms SLO."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}},
            "model": {"name": "resnet", "dynamic": False},
            "slo": {"latencyMs": 100},
            "traffic": {"expectedRps": rps},
            "batching": {
                "supportedBatchSizes": [1, 2, 4, 8],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15, 25, 45]},
            },
            "gpu": {"lane": {"memoryMiB": 4096, "computePercent": 50}},
            **spec,
        },
    }
