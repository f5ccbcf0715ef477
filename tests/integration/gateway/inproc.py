"""A gateway and its workers served from one background event loop on loopback, for protocol tests that
need to start quickly or to run a worker with settings the CLI does not expose (a small body limit).

The servers are the real aiohttp applications on real sockets; clients in the test thread (urllib,
tritonclient, a gRPC channel) talk to them exactly as to separate processes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from tessera.gateway.config import GatewayConfig
from tessera.gateway.server import GRPC_PORT, Gateway, make_gateway_app
from tessera.gateway.worker import OnnxModel, Worker, make_worker_app

from .gateway_harness import MODEL

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; :meth:`call` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


class Stack:
    """Workers and a gateway on one :class:`LoopThread`."""

    def __init__(self, loop: LoopThread) -> None:
        self.loop = loop
        self.runners: list[web.AppRunner] = []
        self.workers: dict[str, web.AppRunner] = {}
        self.url = ""
        self.grpc_target = ""
        self.gateway: Gateway | None = None

    def add_worker(self, model_path: Path, *, max_body: int | None = None, **model_kw: Any) -> str:
        async def go() -> str:
            model = OnnxModel(model_path, name=MODEL, **model_kw)
            kw = {} if max_body is None else {"max_body": max_body}
            runner, url = await _serve(make_worker_app(Worker(model), **kw))
            self.workers[url] = runner
            return url

        return self.loop.call(go())

    def stop_worker(self, url: str) -> None:
        self.loop.call(self.workers.pop(url).cleanup())

    def start_gateway(self, config: dict[str, Any], *, grpc: bool = False) -> str:
        async def go() -> str:
            self.gateway = Gateway(GatewayConfig.parse(config))
            app = make_gateway_app(self.gateway, grpc_port=0 if grpc else None)
            runner, url = await _serve(app)
            self.runners.append(runner)
            if grpc:
                self.grpc_target = f"127.0.0.1:{app[GRPC_PORT]}"
            return url

        self.url = self.loop.call(go())
        return self.url

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return self.loop.call(fn())

    def close(self) -> None:
        async def go() -> None:
            for r in [*self.runners, *self.workers.values()]:
                await r.cleanup()

        self.loop.call(go())


@contextmanager
def stack() -> Iterator[Stack]:
    loop = LoopThread()
    s = Stack(loop)
    try:
        yield s
    finally:
        try:
            s.close()
        finally:
            loop.stop()
