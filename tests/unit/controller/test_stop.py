"""The operator's stop (its kopf cleanup): events still being posted finish before the API client closes.

CI once failed at operator shutdown: an event task outlived the client's close, used the closed session
(aiohttp's `assert self._connector is not None`), and kopf re-raised the failure of the task left behind."""

from __future__ import annotations

import asyncio
import time

import kopf
from aiohttp import web
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import Controller

APP = {
    "apiVersion": "tessera.io/v1alpha1",
    "kind": "App",
    "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
}


async def _until(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _server(gate: asyncio.Event, arrived: list[str], done: list[str]) -> tuple[web.AppRunner, str]:
    async def post(request: web.Request) -> web.Response:
        body = await request.json()
        arrived.append(body["reason"])
        await gate.wait()  # held until the test lets the server answer
        done.append(body["reason"])
        return web.json_response(body, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/events", post)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def test_stop_lets_events_in_flight_finish_before_closing_the_client() -> None:
    async def run() -> None:
        gate, arrived, done = asyncio.Event(), list[str](), list[str]()
        runner, url = await _server(gate, arrived, done)
        ctl = Controller(OperatorConfig())
        ctl.start(kopf.ConnectionInfo(server=url))
        try:
            ctl.post_event(APP, "Normal", "First", "one")
            ctl.post_event(APP, "Normal", "Second", "two")
            await _until(lambda: len(arrived) == 2, "both events at the server")
            tasks = set(ctl._tasks)
            stopping = asyncio.create_task(ctl.stop())
            await _until(lambda: ctl._stopping, "the stop to begin")
            ctl.post_event(APP, "Normal", "Late", "after stop began")  # dropped: the client is closing
            assert not stopping.done()  # still waiting on the two held posts
            gate.set()
            await asyncio.wait_for(stopping, timeout=30)
            assert all(t.done() and not t.cancelled() and t.exception() is None for t in tasks)
            assert sorted(done) == ["First", "Second"]
            assert "Late" not in arrived
            assert ctl.api is not None and ctl.api._client is None  # closed after the posts
        finally:
            await runner.cleanup()

    asyncio.run(run())


def test_stop_cancels_an_event_the_server_never_answers() -> None:
    async def run() -> None:
        gate, arrived, done = asyncio.Event(), list[str](), list[str]()
        runner, url = await _server(gate, arrived, done)
        ctl = Controller(OperatorConfig())
        ctl.start(kopf.ConnectionInfo(server=url))
        try:
            ctl.post_event(APP, "Warning", "Stuck", "never answered")
            await _until(lambda: arrived == ["Stuck"], "the event at the server")
            (task,) = ctl._tasks
            await asyncio.wait_for(ctl.stop(drain_s=0.2), timeout=30)
            assert task.done() and task.cancelled()  # nothing left running to fail after the close
            assert not ctl._tasks and done == []
        finally:
            gate.set()
            await runner.cleanup()

    asyncio.run(run())


def test_stop_waits_for_a_round_in_flight_before_closing_the_client() -> None:
    """At scale a round or a status refresh writes for seconds; kopf's cleanup closed the client under it
    and every such write failed with a traceback ("Session is closed") on each operator stop."""

    async def run() -> None:
        gate, arrived, done = asyncio.Event(), list[str](), list[str]()
        runner, url = await _server(gate, arrived, done)
        ctl = Controller(OperatorConfig())
        ctl.start(kopf.ConnectionInfo(server=url))
        try:
            assert ctl.arbiter is not None and ctl.api is not None
            gate.set()
            ctl.post_event(APP, "Normal", "First", "one")  # the client is made on its first request
            await _until(lambda: done == ["First"] and ctl.api is not None and ctl.api._client, "a request")
            await ctl.arbiter.lock.acquire()  # a round in flight
            stopping = asyncio.create_task(ctl.stop(work_drain_s=30))
            await _until(lambda: ctl.stopping, "the stop to begin")
            await asyncio.sleep(0.2)
            assert not stopping.done() and ctl.api is not None and ctl.api._client is not None
            ctl.arbiter.lock.release()  # the round ends
            await asyncio.wait_for(stopping, timeout=30)
            assert ctl.api._client is None
            assert ctl.arbiter.lock.locked()  # no round starts after the stop took the lock
        finally:
            gate.set()
            await runner.cleanup()

    asyncio.run(run())


def test_stop_closes_the_client_when_a_round_outlasts_the_drain() -> None:
    async def run() -> None:
        gate, arrived, done = asyncio.Event(), list[str](), list[str]()
        runner, url = await _server(gate, arrived, done)
        ctl = Controller(OperatorConfig())
        ctl.start(kopf.ConnectionInfo(server=url))
        try:
            assert ctl.arbiter is not None
            await ctl.arbiter.lock.acquire()  # a round that never ends
            await asyncio.wait_for(ctl.stop(work_drain_s=0.2), timeout=30)
            assert ctl.api is not None and ctl.api._client is None
        finally:
            gate.set()
            await runner.cleanup()

    asyncio.run(run())
