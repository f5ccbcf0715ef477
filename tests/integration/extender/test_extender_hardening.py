"""Who may call the extender, what a malformed request gets, and what SIGTERM does to a bind in flight.

TLS is real (certificates made by `openssl`, served on loopback); the SIGTERM test runs `tessera extender`
as a process against the fake API server of these tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tessera.commands.extender import ListenError, tls_context
from tessera.extender.server import Extender, make_app

from tests.ports import free_port
from tests.requires import missing

from .conftest import Env, node, pod
from .fake_apiserver import FakeApiServer

TESSERA = Path(sys.executable).parent / "tessera"


# -- TLS with client certificates -----------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)  # fmt: skip


def _signed(d: Path, name: str, ca: str, san: str | None = None) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", f"{name}.crt", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        missing("openssl is not installed (hack/install-test-deps.sh installs it)")
    d = tmp_path_factory.mktemp("certs")
    _ca(d, "ca")  # signs the extender's certificate and kube-scheduler's client certificate
    _ca(d, "other-ca")  # anyone else's
    _signed(d, "server", "ca", san="IP:127.0.0.1")
    _signed(d, "scheduler", "ca")
    _signed(d, "intruder", "other-ca")
    return d


def _args(host: str, d: Path | None) -> argparse.Namespace:
    files = (str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt")) if d else (None, None, None)
    return argparse.Namespace(
        host=host, tls_cert_file=files[0], tls_key_file=files[1], tls_client_ca_file=files[2]
    )


@pytest.fixture
async def tls_url(certs: Path) -> AsyncIterator[str]:
    runner = web.AppRunner(make_app(Extender(None)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls_context(_args("0.0.0.0", certs)))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _client(certs: Path, cert: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(certs / f"{cert}.crt"), str(certs / f"{cert}.key"))
    return ctx


async def _bind_over_tls(url: str, ctx: ssl.SSLContext) -> int:
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n"}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/bind", json=args, ssl=ctx) as resp:
        return resp.status


async def test_only_a_client_certificate_of_the_ca_reaches_bind(tls_url: str, certs: Path) -> None:
    """kube-scheduler's certificate (signed by the CA the extender trusts) is answered; no certificate or
    one from another CA fails the TLS handshake, and plain HTTP gets nothing."""
    assert await _bind_over_tls(tls_url, _client(certs, "scheduler")) == 200
    for who in (None, "intruder"):
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await _bind_over_tls(tls_url, _client(certs, who))
    with pytest.raises(aiohttp.ClientError):
        async with (
            aiohttp.ClientSession() as http,
            http.post(tls_url.replace("https", "http") + "/bind", json={}) as r,
        ):
            await r.read()


def test_listening_off_loopback_needs_tls_and_a_client_ca(certs: Path) -> None:
    assert tls_context(_args("127.0.0.1", None)) is None and tls_context(_args("::1", None)) is None
    for host in ("0.0.0.0", "10.0.0.7", "extender.example"):
        with pytest.raises(ListenError, match="not loopback"):
            tls_context(_args(host, None))
    half = _args("0.0.0.0", certs)
    half.tls_client_ca_file = None
    with pytest.raises(ListenError, match="go together"):
        tls_context(half)
    assert tls_context(_args("0.0.0.0", certs)).verify_mode == ssl.CERT_REQUIRED  # type: ignore[union-attr]


def test_the_command_refuses_a_network_address_without_tls(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(TESSERA), "extender", "--host", "0.0.0.0", "--kubeconfig", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "not loopback" in out.stderr and "Traceback" not in out.stderr


# -- malformed requests ------------------------------------------------------------------------------------
def _bad_requests() -> list[tuple[str, Any, str]]:
    """(verb, body, words of the reason) for each kind of malformed request."""
    ok_pod = pod("p")
    weird_ann = pod("w")
    weird_ann["metadata"]["annotations"] = {"tessera.io/placement": {"node": "n"}}
    return [
        ("filter", b"{not json", "not JSON"),
        ("filter", b"\xff\xfe", "not JSON"),
        ("filter", b"[1, 2]", "JSON object"),
        ("filter", b'{"Pod": 1e999, "NodeNames": []}', "not JSON"),
        ("filter", b'{"Pod": NaN}', "not JSON"),
        ("filter", {"Pod": "p", "NodeNames": ["a"]}, "Pod must be a JSON object"),
        ("filter", {"Pod": {"metadata": []}, "NodeNames": ["a"]}, "Pod.metadata"),
        ("filter", {"Pod": ok_pod, "NodeNames": [1, 2]}, "NodeNames[0]"),
        ("filter", {"Pod": ok_pod, "NodeNames": "a"}, "NodeNames"),
        ("filter", {"Pod": ok_pod, "Nodes": {"items": [1]}}, "Nodes.items[0]"),
        ("filter", {"Pod": ok_pod}, "NodeNames"),
        ("filter", {"Pod": weird_ann, "NodeNames": ["a"]}, "annotations"),
        ("filter", {"Pod": {**ok_pod, "spec": {"containers": {"c": 1}}}, "NodeNames": ["a"]}, "containers"),
        ("filter", {"Pod": {**ok_pod, "spec": {"containers": [{"resources": []}]}}, "NodeNames": ["a"]}, "resources"),
        ("prioritize", {"Pod": {**ok_pod, "metadata": {**ok_pod["metadata"], "uid": 7}}, "NodeNames": ["a"]}, "uid"),
        ("prioritize", {"Pod": ok_pod}, "NodeNames"),
        ("bind", {"PodName": "p"}, "PodNamespace"),
        ("bind", {"PodName": "p", "PodNamespace": "d", "PodUID": 1, "Node": "n"}, "PodUID"),
        ("bind", {"PodName": "p" * 300, "PodNamespace": "d", "PodUID": "u", "Node": "n"}, "at most 253"),
    ]  # fmt: skip


async def test_every_malformed_request_gets_a_4xx_json_reason(env: Env) -> None:
    env.api.put_node(node("a"))
    await env.settle(lambda: "a" in env.extender.view.nodes)
    for verb, body, why in _bad_requests():
        kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with env.http.post(f"{env.url}/{verb}", **kwargs) as resp:
            answer = await resp.json()
            assert resp.status == 400 and why in answer["Error"], (verb, body, resp.status, answer)
    # aiohttp's own refusals are JSON with the reason too.
    async with env.http.get(f"{env.url}/bind") as resp:
        assert resp.status == 405 and (await resp.json())["Error"]
    async with env.http.post(f"{env.url}/nope", json={}) as resp:
        assert resp.status == 404 and (await resp.json())["Error"]


async def test_a_body_over_the_cap_is_413(env: Env) -> None:
    server = TestServer(make_app(env.extender, max_body=1 << 16))
    await server.start_server()
    try:
        async with env.http.post(server.make_url("/filter"), data=b" " * (1 << 17)) as resp:
            assert resp.status == 413 and "65536" in (await resp.json())["Error"]
    finally:
        await server.close()


async def test_bad_quantities_and_annotations_are_reasons_never_500(env: Env) -> None:
    """1e999 as a number (inf once parsed), NaN profile, a float quantity: filter answers 200 with the reason
    per node, prioritize scores 0."""
    env.api.put_node(node("a"))
    await env.settle(lambda: "a" in env.extender.view.nodes)
    cases = [
        pod("huge-number", memory=None) | {"spec": {"containers": [{"resources": {"limits": {"tessera.io/gpu-memory": 1e308}}}]}},
        pod("string-1e999", memory="1e999"),
        pod("float-compute", compute=12.5),
        pod("nan-profile", annotations={"tessera.io/profile": "nan"}),
        pod("inf-profile", annotations={"tessera.io/profile": "inf"}),
        pod("bad-placement", annotations={"tessera.io/placement": "{\"node\": 1e999}"}),
        pod("bad-workload", annotations={"tessera.io/workload": "training:urgent"}),
    ]  # fmt: skip
    for bad in cases:
        status, out = await env.post("filter", {"Pod": bad, "NodeNames": ["a", "ghost"]})
        assert status == 200 and out["NodeNames"] == [] and set(out["FailedNodes"]) == {"a", "ghost"}, out
        status, scores = await env.post("prioritize", {"Pod": bad, "NodeNames": ["a", "ghost"]})
        assert status == 200 and [s["Score"] for s in scores] == [0, 0]


# -- SIGTERM mid-bind ----------------------------------------------------------------------------------------
class SlowBindApi(FakeApiServer):
    """Holds each Binding until `release` is set, so a SIGTERM can arrive while a bind is in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.bind_started = asyncio.Event()
        self.release = asyncio.Event()

    async def _bind(self, request: web.Request) -> web.Response:
        self.bind_started.set()
        await self.release.wait()
        return await super()._bind(request)


async def _wait(predicate: Any, timeout: float, what: str, proc: Any = None) -> None:
    deadline = time.monotonic() + timeout  # bounds a failure only: the machine may be loaded
    while not await predicate():
        if proc is not None and proc.returncode is not None:
            raise AssertionError(
                f"the extender exited ({proc.returncode}): {(await proc.stderr.read())[-2000:]!r}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_sigterm_mid_bind_stops_accepting_finishes_the_bind_and_exits_0(tmp_path: Path) -> None:
    api = SlowBindApi()
    api.put_node(node("gpu-a"))
    api.put_pod(pod("p"))
    server = TestServer(api.app())
    await server.start_server()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{str(server.make_url('')).rstrip('/')}'}}}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    port, metrics_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        str(TESSERA), "extender", "--kubeconfig", str(kubeconfig), "--port", str(port),
        "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    http = aiohttp.ClientSession()
    try:

        async def synced() -> bool:
            try:
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                    return 'node="gpu-a"' in await resp.text()
            except aiohttp.ClientError:
                return False

        await _wait(synced, 60, "the extender to list the node", proc)
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "gpu-a"}
        bind = asyncio.create_task(http.post(f"http://127.0.0.1:{port}/bind", json=args))
        await asyncio.wait_for(api.bind_started.wait(), 60)
        proc.send_signal(signal.SIGTERM)

        async def refusing() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return False
            except OSError:
                return True

        await _wait(refusing, 30, "the extender to stop accepting connections")
        assert proc.returncode is None  # the bind in flight holds the exit
        api.release.set()
        resp = await asyncio.wait_for(bind, 30)
        assert resp.status == 200 and (await resp.json()) == {"Error": ""}
        assert api.pods["default/p"]["spec"]["nodeName"] == "gpu-a"
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert proc.stderr is not None
        assert b"Traceback" not in await proc.stderr.read()
    finally:
        api.release.set()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await http.close()
        await server.close()
