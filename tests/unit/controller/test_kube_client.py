"""The operator's API client (controller/kube.py) over TLS: one pooled connection, calls timed."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import kopf
from aiohttp import web
from tessera.controller.kube import PODS, KubeApi

from tests.requires import missing


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        missing("no openssl to make a serving certificate (hack/install-test-deps.sh installs it)")
    key, crt = tmp / "tls.key", tmp / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, crt


def test_calls_over_tls_share_one_connection_and_are_timed(tmp_path: Path) -> None:
    # A CA path made a fresh SSL context per request; aiohttp pools connections per context object, so
    # every call opened a new connection with a TLS handshake (4x slower rounds against a real API server).
    key, crt = _self_signed(tmp_path)
    peers: list[object] = []

    async def patch(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({})

    async def run() -> KubeApi:
        app = web.Application()
        app.router.add_patch("/api/v1/namespaces/ns/pods/{name}", patch)
        runner = web.AppRunner(app)
        await runner.setup()
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(crt), str(key))
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        port = runner.addresses[0][1]
        api = KubeApi(kopf.ConnectionInfo(server=f"https://127.0.0.1:{port}", ca_path=str(crt)))
        try:
            for i in range(5):
                await api.patch(PODS, "ns", f"p{i}", {"metadata": {"labels": {"i": str(i)}}})
        finally:
            await api.close()
            await runner.cleanup()
        return api

    api = asyncio.run(run())
    assert len(peers) == 5
    assert len(set(peers)) == 1, f"each call opened its own connection: {peers}"
    call = ("", "pods", "patch")
    assert api.counts[call] == 5
    assert 0 < api.busy_s <= api.seconds[call] + 1e-9


def test_a_burst_of_events_leaves_room_for_the_rounds_writes() -> None:
    # 150 events at once used to take all 100 connections of the session's pool; a pod create sent after
    # them waited until events finished. Events now go a few at a time and the create goes straight out.
    events_seen = peak = 0
    in_flight = 0
    release = asyncio.Event()

    async def event(request: web.Request) -> web.Response:
        nonlocal events_seen, peak, in_flight
        events_seen += 1
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1
        return web.json_response({}, status=201)

    async def pod(request: web.Request) -> web.Response:
        return web.json_response({}, status=201)

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/api/v1/namespaces/ns/events", event)
        app.router.add_post("/api/v1/namespaces/ns/pods", pod)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        api = KubeApi(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"))
        owner = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
        try:
            posts = [asyncio.create_task(api.post_event(owner, "Normal", "R", f"m{i}")) for i in range(150)]
            deadline = time.monotonic() + 60
            while events_seen < api.events_in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(api.create(PODS, "ns", {"metadata": {"name": "p"}}), timeout=60)
            assert events_seen == api.events_in_flight  # the rest wait their turn
            release.set()
            await asyncio.wait_for(asyncio.gather(*posts), timeout=60)
        finally:
            release.set()
            await api.close()
            await runner.cleanup()

    asyncio.run(run())
    assert events_seen == 150
    assert peak == KubeApi.events_in_flight
