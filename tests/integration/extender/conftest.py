"""Fixtures: a fake API server, the extender's HTTP server synced from it, and object builders."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).parent))

from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.extender.handoff import Handoffs
from tessera.extender.server import Extender, make_app
from tessera.kube import KubeClient, KubeConfig

from .fake_apiserver import FakeApiServer


def node(name: str, gpus: int = 2, memory_mib: int = 16000, annotate: bool = True) -> dict[str, Any]:
    inv = [GpuInfo(uuid=f"GPU-{name}-{i}", index=i, model="P100", memory_mib=memory_mib) for i in range(gpus)]
    ann = {contract.ANN_NODE_GPUS: dump_node_gpus(inv)} if annotate else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann}}


def pod(
    name: str,
    memory: int | str | None = 4000,
    compute: int | str | None = 25,
    gpus: int = 1,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {contract.RESOURCE_GPU: str(gpus)}
    if memory is not None:
        limits[contract.RESOURCE_GPU_MEMORY] = str(memory)
    if compute is not None:
        limits[contract.RESOURCE_GPU_COMPUTE] = str(compute)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class Env:
    api: FakeApiServer
    extender: Extender
    http: aiohttp.ClientSession
    url: str
    stop: asyncio.Event  # set: the extender's sync_forever should return
    sync: asyncio.Task[None]

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        async with self.http.post(f"{self.url}/{verb}", json=body) as resp:
            return resp.status, (await resp.json() if resp.status == 200 else await resp.text())

    async def settle(self, predicate: Any, timeout: float = 60.0) -> None:
        """Wait for the view to reach `predicate`; the deadline only bounds a failure (a loaded machine)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"the extender's view never caught up with the API server in {timeout}s")
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_env(
    api: FakeApiServer, handoffs: Handoffs | None = None, handoff_wait_s: float = 3.0
) -> AsyncIterator[Env]:
    """`api` served, the extender's HTTP server, and its list+watch of `api` just started (use settle)."""
    api_server = TestServer(api.app())
    await api_server.start_server()
    kube = KubeClient(KubeConfig(str(api_server.make_url("")).rstrip("/")))
    extender = Extender(kube, handoffs=handoffs, handoff_wait_s=handoff_wait_s)
    ext_server = TestServer(make_app(extender))
    await ext_server.start_server()
    stop = asyncio.Event()
    sync = asyncio.create_task(extender.sync_forever(stop, retry_seconds=0.1))
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200))
    try:
        yield Env(api, extender, http, str(ext_server.make_url("")).rstrip("/"), stop, sync)
    finally:
        stop.set()
        sync.cancel()
        await asyncio.gather(sync, return_exceptions=True)
        await http.close()
        await kube.close()
        await ext_server.close()
        await api_server.close()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with running_env(FakeApiServer()) as started:
        yield started
