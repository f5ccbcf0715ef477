"""Tessera's one Kubernetes API client, for the operator, the scheduler extender and the node agent.

Built on `kubernetes_asyncio` (config loading, auth, TLS, connection pooling). Objects travel as JSON dicts
(camelCase, as the API server sends them): requests go through `ApiClient.call_api` with
`_preload_content=False` and the body is decoded once with orjson, and a watch yields the server's event
lines decoded the same way. The generated models are not used on these paths: at 5,000 nodes and 10,000
pods they made a list + watch several times slower (docs/operations.md, "Kubernetes client").

Credentials come from one place, `KubeConfig`: a kubeconfig file (any context, any user kind the official
client reads), the in-cluster service account, or explicit fields (kopf's ConnectionInfo in the operator,
tests). `api_client` builds one ApiClient from it; its TLS context is made when the client is built, so PEM
data (a kubeconfig's `client-key-data`, kopf's key in memory) is written to a private directory only for
that moment and removed before the client is returned: no key material stays on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException, incluster_config, kube_config
from yarl import URL

from tessera.api.safe_load import InputError, load_yaml_file

JsonObj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# A request that takes longer than this has failed (the server's own limit for non-watch calls is 60 s);
# watches run until the server or the caller ends them.
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=300)
WATCH_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None)
READ_BUFSIZE = 2**21  # kubernetes_asyncio's: one watch event line may carry a large object


@dataclass(frozen=True, slots=True)
class Kind:
    """Where a resource lives in the API: group ('' for core), version, plural."""

    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"
        out = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{self.plural}"
        if name:
            out += f"/{name}"
        if sub:
            out += f"/{sub}"
        return out


PODS = Kind("", "v1", "pods")
NODES = Kind("", "v1", "nodes")
SERVICES = Kind("", "v1", "services")
CONFIGMAPS = Kind("", "v1", "configmaps")
EVENTS = Kind("", "v1", "events")
DEPLOYMENTS = Kind("apps", "v1", "deployments")


class KubeError(RuntimeError):
    """An API call failed; `status` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeConfig:
    """Credentials for one API server. Build with `from_kubeconfig`, `in_cluster`, `from_kopf`, or give
    `server` (and a token, CA, client certificate) directly."""

    server: str = ""
    token: str | None = None
    scheme: str = "Bearer"
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None  # PEM, kept in memory
    key_data: bytes | None = None
    insecure: bool = False
    kubeconfig: str | None = None  # load this file (with `context`) instead of the fields above
    context: str | None = None
    incluster: bool = False

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        if not os.environ.get(incluster_config.SERVICE_HOST_ENV_NAME):
            raise KubeError("not running in a cluster: KUBERNETES_SERVICE_HOST is unset (use --kubeconfig)")
        return cls(incluster=True)

    @classmethod
    def from_kubeconfig(cls, path: str | Path, context: str | None = None) -> KubeConfig:
        """Check now that the file reads and names the context (a bad flag fails at start, not at the first
        call); the credentials themselves are loaded when the client is built."""
        try:  # size, UTF-8, nesting and one document checked first; its fields by the official loader
            doc = load_yaml_file(path)
        except InputError as err:
            where = f"{err.field}: " if err.field else ""
            raise KubeError(f"cannot use kubeconfig {path}: {where}{err.problem}") from None
        try:
            kube_config.KubeConfigLoader(doc, active_context=context)
        except (ConfigException, AssertionError, TypeError, KeyError) as err:
            raise KubeError(f"cannot use kubeconfig {path}: {err or type(err).__name__}") from err
        return cls(kubeconfig=str(path), context=context)

    @classmethod
    def from_kopf(cls, conn: Any) -> KubeConfig:
        """The credentials kopf logged in with (a `kopf.ConnectionInfo`)."""

        def pem(value: Any) -> bytes | None:
            return value.encode() if isinstance(value, str) else value

        ca = pem(conn.ca_data)
        return cls(
            server=str(conn.server).rstrip("/"),
            token=conn.token,
            scheme=conn.scheme or "Bearer",
            ca_file=str(conn.ca_path) if conn.ca_path else None,
            ca_data=ca.decode() if ca else None,
            cert_file=str(conn.certificate_path) if conn.certificate_path else None,
            key_file=str(conn.private_key_path) if conn.private_key_path else None,
            cert_data=pem(conn.certificate_data),
            key_data=pem(conn.private_key_data),
            insecure=bool(conn.insecure),
        )


def default_config() -> KubeConfig:
    """The in-cluster service account inside a pod, else the kubeconfig `kubectl` would use ($KUBECONFIG's
    first file, or ~/.kube/config)."""
    if os.environ.get(incluster_config.SERVICE_HOST_ENV_NAME):
        return KubeConfig.in_cluster()
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    return KubeConfig.from_kubeconfig(os.path.expanduser(path))


async def api_client(config: KubeConfig) -> client.ApiClient:
    """One ApiClient (one aiohttp connection pool) for `config`; see the module doc on key material."""
    cfg = client.Configuration()
    if config.incluster and not config.kubeconfig:
        # The service account's files are read where the kubelet mounted them: no temporary directory, so a
        # container with a read-only root filesystem and no writable /tmp can connect (the chart's extender
        # exited at start with "No usable temporary directory found" on the first real node).
        try:
            incluster_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return _env_read_once(client.ApiClient(cfg))
        except (OSError, ConfigException, ValueError) as err:
            raise KubeError(f"cannot load Kubernetes credentials: {err}") from err
    with tempfile.TemporaryDirectory(prefix="tessera-kube-") as tmp:  # mode 0700, removed on exit
        try:
            if config.kubeconfig:
                await kube_config.load_kube_config(
                    config.kubeconfig,
                    config.context,
                    client_configuration=cfg,
                    persist_config=False,
                    temp_file_path=tmp,
                )
            else:
                _set_fields(cfg, config, Path(tmp))
            api = client.ApiClient(cfg)  # reads the CA, certificate and key into its SSL context now
        except (OSError, ConfigException, ValueError) as err:
            raise KubeError(f"cannot load Kubernetes credentials: {err}") from err
        finally:
            # the loader remembers its temp files (to reuse them, and delete them at exit): forget them now
            kube_config._cleanup_temp_files()
    return _env_read_once(api)


def _env_read_once(api: client.ApiClient) -> client.ApiClient:
    """The client's session with the proxy environment read now, once, instead of on every request.

    kubernetes_asyncio's session trusts the environment, and aiohttp then looks up the proxy variables
    and ~/.netrc in a worker thread on every request: two thread hand-offs per call, a tenth of the
    operator's CPU in a 1000-App round. A proxy the environment names for the API server is kept (passed
    with each request, as the official client passes a configured one); netrc is dropped, since every
    request already carries its credentials (aiohttp refuses netrc auth next to an Authorization header)."""
    rest = api.rest_client
    if not rest.proxy and api.configuration.host:
        with contextlib.suppress(LookupError):  # no proxy for this server in the environment
            proxy, auth = get_env_proxy_for_url(URL(api.configuration.host))
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": auth.encode()}
    old = rest.pool_manager
    connector = old.connector
    old.detach()  # the connector (pool, TLS context) moves to the new session, which owns it
    rest.pool_manager = aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE)
    return api


def _set_fields(cfg: client.Configuration, config: KubeConfig, tmp: Path) -> None:
    if not config.server:
        raise KubeError("no API server given")
    cfg.host = config.server.rstrip("/")
    if config.token:
        cfg.api_key = {"BearerToken": config.token}
        cfg.api_key_prefix = {"BearerToken": config.scheme}
    cfg.ssl_ca_cert = config.ca_file or _private_file(tmp / "ca.crt", config.ca_data)
    cfg.cert_file = config.cert_file or _private_file(tmp / "client.crt", config.cert_data)
    cfg.key_file = config.key_file or _private_file(tmp / "client.key", config.key_data)
    cfg.verify_ssl = not config.insecure


def _private_file(path: Path, data: str | bytes | None) -> str | None:
    if data is None:
        return None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return str(path)


@contextlib.contextmanager
def _transport_errors(what: str) -> Iterator[None]:
    """A connection or timeout failure during `what` (e.g. "GET /api/v1/pods") as a KubeError (status 0)."""
    try:
        yield
    except (aiohttp.ClientError, TimeoutError) as err:
        raise KubeError(f"{what}: {err or type(err).__name__}") from err


class KubeClient:
    """JSON calls to one API server. The ApiClient is built on the first call (credentials loading is
    async) and shared by every call after; `close` ends its connection pool."""

    def __init__(self, config: KubeConfig) -> None:
        self.config = config
        self._api: client.ApiClient | None = None
        self._building: asyncio.Lock | None = None

    async def _client(self) -> client.ApiClient:
        if self._api is None:
            if self._building is None:
                self._building = asyncio.Lock()
            async with self._building:
                if self._api is None:
                    self._api = await api_client(self.config)
        return self._api

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout = REQUEST_TIMEOUT,
    ) -> aiohttp.ClientResponse:
        api = await self._client()
        with _transport_errors(f"{method} {path}"):
            resp: aiohttp.ClientResponse = await api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        if resp.status >= 300:
            text = (await resp.read()).decode(errors="replace")
            resp.release()
            raise KubeError(f"{method} {path}: HTTP {resp.status}: {text[:300]}", resp.status)
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObj:
        """One call; the decoded JSON reply ({} when empty). Any status >= 300 raises KubeError."""
        resp = await self._send(method, path, query=query, body=body, content_type=content_type)
        try:
            with _transport_errors(f"{method} {path}"):
                data = await resp.read()
        finally:
            resp.release()
        result: JsonObj = orjson.loads(data) if data else {}
        return result

    async def watch(
        self, path: str, resource_version: str | None, *, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[JsonObj]:
        """Yield watch events ({"type", "object"}) until the server closes the stream."""
        params = {"watch": "true", "allowWatchBookmarks": "true", **(query or {})}
        if resource_version:
            params["resourceVersion"] = resource_version
        resp = await self._send("GET", path, query=params, timeout=WATCH_TIMEOUT)
        try:
            with _transport_errors(f"watch {path}"):
                while line := await resp.content.readline():
                    if line.strip():
                        event: JsonObj = orjson.loads(line)
                        yield event
        finally:
            resp.close()

    # -- the calls the extender and the node agent make ----------------------------------------------------
    async def list_nodes(self) -> JsonObj:
        return await self.request("GET", NODES.path(None))

    async def get_node(self, name: str) -> JsonObj:
        return await self.request("GET", NODES.path(None, name))

    async def patch_node_taints(
        self, name: str, taints: list[JsonObj], *, resource_version: str | None = None
    ) -> JsonObj:
        """Set the Node's taints to `taints` (the list is atomic: a patch replaces it whole). With
        `resource_version`, only if the Node is still at it (else KubeError with status 409)."""
        body: JsonObj = {"spec": {"taints": taints or None}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self.request("PATCH", NODES.path(None, name), body=body, content_type=MERGE_PATCH)

    async def list_pods(self, *, field_selector: str | None = None) -> JsonObj:
        query = {"fieldSelector": field_selector} if field_selector else None
        return await self.request("GET", PODS.path(None), query=query)

    async def get_pod(self, namespace: str, name: str) -> JsonObj:
        return await self.request("GET", PODS.path(namespace, name))

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> JsonObj:
        body = {"metadata": {"annotations": annotations}}
        return await self.request("PATCH", PODS.path(namespace, name), body=body, content_type=MERGE_PATCH)

    async def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> JsonObj:
        """Merge the annotations into the Node's; a None value removes that key."""
        body = {"metadata": {"annotations": dict(annotations)}}
        return await self.request("PATCH", NODES.path(None, name), body=body, content_type=MERGE_PATCH)

    async def delete_pod(self, namespace: str, name: str, *, uid: str | None = None) -> JsonObj:
        """Delete; with `uid`, only if the pod is still that one (a precondition the server checks)."""
        body = {"preconditions": {"uid": uid}} if uid else None
        return await self.request("DELETE", PODS.path(namespace, name), body=body)

    async def create_event(self, namespace: str, event: JsonObj) -> JsonObj:
        return await self.request("POST", EVENTS.path(namespace), body=event)

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> JsonObj:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return await self.request("POST", PODS.path(namespace, name, "binding"), body=body)
