"""A small typed Kubernetes API client over aiohttp: list/watch nodes and pods, patch pods, bind.

Only what the extender needs. Credentials come from a kubeconfig (token, client certificate or none) or
the in-cluster service account.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(RuntimeError):
    """An API call failed; `status` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeConfig:
    server: str
    token: str | None = None
    ssl_context: ssl.SSLContext | bool = True

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if not host:
            raise KubeError("not running in a cluster: KUBERNETES_SERVICE_HOST is unset (use --kubeconfig)")
        ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
        return cls(f"https://{host}:{port}", (SA_DIR / "token").read_text().strip(), ctx)

    @classmethod
    def from_kubeconfig(cls, path: str | Path, context: str | None = None) -> KubeConfig:
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise KubeError(f"cannot read kubeconfig {path}: {err}") from err
        name = context or doc.get("current-context")
        ctx = _named(doc.get("contexts", []), name, "context", path)["context"]
        cluster = _named(doc.get("clusters", []), ctx["cluster"], "cluster", path)["cluster"]
        user = (
            _named(doc.get("users", []), ctx.get("user"), "user", path).get("user", {})
            if ctx.get("user")
            else {}
        )
        ssl_ctx: ssl.SSLContext | bool = True
        if cluster.get("insecure-skip-tls-verify"):
            ssl_ctx = False
        elif "certificate-authority-data" in cluster or "certificate-authority" in cluster:
            ca_data = cluster.get("certificate-authority-data")
            ssl_ctx = ssl.create_default_context(
                cadata=base64.b64decode(ca_data).decode() if ca_data else None,
                cafile=cluster.get("certificate-authority"),
            )
        if isinstance(ssl_ctx, ssl.SSLContext) and (
            "client-certificate-data" in user or "client-certificate" in user
        ):
            cert, key = _file_or_data(user, "client-certificate"), _file_or_data(user, "client-key")
            ssl_ctx.load_cert_chain(cert, key)
        return cls(str(cluster["server"]).rstrip("/"), user.get("token"), ssl_ctx)


def _named(items: list[JsonObj], name: str | None, what: str, path: str | Path) -> JsonObj:
    for item in items:
        if item.get("name") == name:
            return item
    raise KubeError(f"kubeconfig {path} has no {what} named {name!r}")


def _file_or_data(user: JsonObj, key: str) -> str:
    if key in user:
        return str(user[key])
    with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem") as f:
        f.write(base64.b64decode(user[f"{key}-data"]))
        return f.name


class KubeClient:
    def __init__(self, config: KubeConfig, session: aiohttp.ClientSession | None = None) -> None:
        self.config = config
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._session = session or aiohttp.ClientSession(headers=headers)

    async def close(self) -> None:
        await self._session.close()

    async def _call(
        self, method: str, path: str, *, body: Any = None, content_type: str = "application/json"
    ) -> JsonObj:
        url = self.config.server + path
        data = None if body is None else json.dumps(body)
        try:
            async with self._session.request(
                method, url, data=data, headers={"Content-Type": content_type}, ssl=self.config.ssl_context
            ) as resp:
                text = await resp.text()
                if resp.status >= 300:
                    raise KubeError(f"{method} {path}: HTTP {resp.status}: {text[:300]}", resp.status)
                result: JsonObj = json.loads(text) if text else {}
                return result
        except aiohttp.ClientError as err:
            raise KubeError(f"{method} {path}: {err}") from err

    async def list(self, path: str) -> JsonObj:
        return await self._call("GET", path)

    async def list_nodes(self) -> JsonObj:
        return await self.list("/api/v1/nodes")

    async def list_pods(self) -> JsonObj:
        return await self.list("/api/v1/pods")

    async def get_pod(self, namespace: str, name: str) -> JsonObj:
        return await self._call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> JsonObj:
        body = {"metadata": {"annotations": annotations}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        return await self._call("PATCH", path, body=body, content_type="application/merge-patch+json")

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> JsonObj:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return await self._call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=body)

    async def watch(self, path: str, resource_version: str | None) -> AsyncIterator[JsonObj]:
        """Yield watch events ({"type", "object"}) until the server closes the stream."""
        query = "?watch=true&allowWatchBookmarks=true" + (
            f"&resourceVersion={resource_version}" if resource_version else ""
        )
        url = self.config.server + path + query
        try:
            async with self._session.get(
                url, ssl=self.config.ssl_context, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)
            ) as resp:
                if resp.status >= 300:
                    raise KubeError(
                        f"watch {path}: HTTP {resp.status}: {(await resp.text())[:300]}", resp.status
                    )
                async for line in resp.content:
                    if line.strip():
                        event: JsonObj = json.loads(line)
                        yield event
        except aiohttp.ClientError as err:
            raise KubeError(f"watch {path}: {err}") from err
