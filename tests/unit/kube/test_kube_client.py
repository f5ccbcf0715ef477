"""Tessera's one Kubernetes client (tessera.kube): credentials from each source over mutual TLS, no key
material left on disk, errors and watches as the components read them."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio.config import kube_config
from tessera.kube import KubeClient, KubeConfig, KubeError, api_client

from tests.requires import missing


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        missing("no openssl to make certificates (hack/install-test-deps.sh installs it)")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))  # fmt: skip
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("server", ["-extfile", str(ext)]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                 "-out", str(d / f"{name}.crt"), *extra)  # fmt: skip
    return {p.stem + p.suffix: p for p in d.iterdir()}


@pytest.fixture
async def server(pki: dict[str, Path]) -> AsyncIterator[str]:
    """An HTTPS server that requires a client certificate from the CA (as an API server does)."""

    async def pod(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(x[0] for x in (peer or {}).get("subject", ()))
        return web.json_response(
            {"kind": "Pod", "metadata": {"name": request.match_info["name"]}, "cn": subject}
        )

    async def missing(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "reason": "NotFound"}, status=404)

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        rv = request.query.get("resourceVersion", "")
        for i in range(3):
            await resp.write(
                b'{"type":"ADDED","object":{"metadata":{"name":"n%d","rv":"%s"}}}\n' % (i, rv.encode())
            )
        return resp  # the server closes the stream: the watch ends

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/{name}", pod)
    app.router.add_get("/api/v1/namespaces/ns/pods", missing)
    app.router.add_get("/api/v1/nodes", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki["ca.crt"]))
    ctx.load_cert_chain(str(pki["server.crt"]), str(pki["server.key"]))
    ctx.verify_mode = ssl.CERT_REQUIRED
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.fixture
def tmpdir_watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary files go under a directory of this test's own, so what is left there can be checked."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def _left_files(scratch: Path) -> list[Path]:
    """Anything left under the scratch directory (a key file, or the private directory that held it)."""
    return sorted(scratch.rglob("*"))


async def _get_pod(kube: KubeClient) -> dict[str, Any]:
    try:
        return await kube.request("GET", "/api/v1/namespaces/ns/pods/p")
    finally:
        await kube.close()


async def test_kubeconfig_with_inline_client_key_leaves_no_file(
    pki: dict[str, Path], server: str, tmp_path: Path, tmpdir_watched: Path
) -> None:
    def b64(name: str) -> str:
        return base64.b64encode(pki[name].read_bytes()).decode()

    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "client-certificate-data": b64("client.crt"),
                            "client-key-data": b64("client.key"),
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    pod = await _get_pod(KubeClient(KubeConfig.from_kubeconfig(path)))
    assert pod["cn"] == {"commonName": "client"}  # the server saw the kubeconfig's client certificate
    assert _left_files(tmpdir_watched) == []
    assert kube_config._temp_files == {}  # the loader would otherwise hand the deleted paths out again


async def test_kopf_credentials_in_memory_leave_no_file(
    pki: dict[str, Path], server: str, tmpdir_watched: Path
) -> None:
    conn = kopf.ConnectionInfo(
        server=server,
        ca_data=pki["ca.crt"].read_bytes(),
        certificate_data=pki["client.crt"].read_bytes(),
        private_key_data=pki["client.key"].read_bytes(),
    )
    pod = await _get_pod(KubeClient(KubeConfig.from_kopf(conn)))
    assert pod["cn"] == {"commonName": "client"}
    assert _left_files(tmpdir_watched) == []


async def test_without_the_client_certificate_the_server_refuses(pki: dict[str, Path], server: str) -> None:
    with pytest.raises(KubeError) as err:
        await _get_pod(KubeClient(KubeConfig(server, ca_file=str(pki["ca.crt"]))))
    assert err.value.status == 0  # refused during the TLS handshake: no HTTP status


async def test_http_errors_carry_the_status_and_a_watch_ends_with_its_stream(
    pki: dict[str, Path], server: str
) -> None:
    kube = KubeClient(
        KubeConfig(
            server,
            ca_file=str(pki["ca.crt"]),
            cert_file=str(pki["client.crt"]),
            key_file=str(pki["client.key"]),
        )
    )
    try:
        with pytest.raises(KubeError, match="HTTP 404") as err:
            await kube.request("GET", "/api/v1/namespaces/ns/pods")
        assert err.value.status == 404
        events = [e async for e in kube.watch("/api/v1/nodes", "42")]
    finally:
        await kube.close()
    assert [(e["type"], e["object"]["metadata"]) for e in events] == [
        ("ADDED", {"name": f"n{i}", "rv": "42"}) for i in range(3)
    ]


def test_a_bad_kubeconfig_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(KubeError, match="cannot use kubeconfig"):
        KubeConfig.from_kubeconfig(tmp_path / "absent")
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"contexts": [], "clusters": [], "current-context": "x"}))
    with pytest.raises(KubeError, match="cannot use kubeconfig"):
        KubeConfig.from_kubeconfig(path, "nope")


async def test_the_environment_is_read_once_not_on_every_request(
    pki: dict[str, Path], server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubernetes_asyncio's session made aiohttp look up the proxy variables and ~/.netrc in a worker
    thread on every request (a tenth of the operator's CPU in a 1000-App round); the client reads the
    environment once, when it is built, and a proxy named there for the API server is still used."""
    looked: list[str] = []
    proxy_lookup, netrc_lookup = aiohttp.client.get_env_proxy_for_url, aiohttp.client.netrc_from_env
    monkeypatch.setattr(
        aiohttp.client, "get_env_proxy_for_url", lambda u: looked.append("proxy") or proxy_lookup(u)
    )
    monkeypatch.setattr(aiohttp.client, "netrc_from_env", lambda: looked.append("netrc") or netrc_lookup())
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the test server is reached directly
    kube = KubeClient(
        KubeConfig(
            server,
            ca_file=str(pki["ca.crt"]),
            cert_file=str(pki["client.crt"]),
            key_file=str(pki["client.key"]),
        )
    )
    try:
        for _ in range(3):
            assert (await kube.request("GET", "/api/v1/namespaces/ns/pods/p"))["kind"] == "Pod"
    finally:
        await kube.close()
    assert looked == []

    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.example:3128")
    api = await api_client(KubeConfig("https://api.example:6443", insecure=True))
    try:
        assert api.rest_client.proxy == "http://proxy.example:3128"
        assert api.rest_client.proxy_headers == {"Proxy-Authorization": "Basic dXNlcjpwdw=="}  # user:pw
    finally:
        await api.close()
