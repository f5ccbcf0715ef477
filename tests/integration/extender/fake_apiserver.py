"""A minimal Kubernetes API server for the extender's calls: list/watch nodes and pods, get and
merge-patch pods, and create pods/binding.

kmock's KubernetesEmulator has no `pods/binding` subresource (create a Binding → sets spec.nodeName), which
the extender's bind needs, so these tests use this small aiohttp server instead.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

JsonObj = dict[str, Any]


class FakeApiServer:
    def __init__(self) -> None:
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[str, JsonObj] = {}
        self.bindings: list[JsonObj] = []
        self.rv = 1
        self._watchers: dict[str, list[asyncio.Queue[JsonObj]]] = {"nodes": [], "pods": []}

    def _bump(self, obj: JsonObj) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def _emit(self, kind: str, event: str, obj: JsonObj) -> None:
        for q in self._watchers[kind]:
            q.put_nowait({"type": event, "object": json.loads(json.dumps(obj))})

    def put_node(self, node: JsonObj) -> None:
        event = "MODIFIED" if node["metadata"]["name"] in self.nodes else "ADDED"
        self._bump(node)
        self.nodes[node["metadata"]["name"]] = node
        self._emit("nodes", event, node)

    def put_pod(self, pod: JsonObj) -> None:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        event = "MODIFIED" if key in self.pods else "ADDED"
        self._bump(pod)
        self.pods[key] = pod
        self._emit("pods", event, pod)

    def delete_pod(self, key: str) -> None:
        pod = self.pods.pop(key)
        self._emit("pods", "DELETED", pod)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self._list("nodes"))
        app.router.add_get("/api/v1/pods", self._list("pods"))
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch_pod)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self._bind)
        return app

    def _list(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            store = self.nodes if kind == "nodes" else self.pods
            if request.query.get("watch") != "true":
                return web.json_response(
                    {
                        "kind": "List",
                        "metadata": {"resourceVersion": str(self.rv)},
                        "items": list(store.values()),
                    }
                )
            q: asyncio.Queue[JsonObj] = asyncio.Queue()
            self._watchers[kind].append(q)
            resp = web.StreamResponse()
            await resp.prepare(request)
            try:
                while True:
                    await resp.write((json.dumps(await q.get()) + "\n").encode())
            finally:
                self._watchers[kind].remove(q)

        return handle

    async def _get_pod(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        if key not in self.pods:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(self.pods[key])

    async def _patch_pod(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        if request.content_type != "application/merge-patch+json":
            return web.json_response(
                {"message": f"unsupported patch type {request.content_type}"}, status=415
            )
        if key not in self.pods:
            return web.json_response({"reason": "NotFound"}, status=404)
        patch = await request.json()
        pod = self.pods[key]
        pod["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
        self.put_pod(pod)
        return web.json_response(pod)

    async def _bind(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        body = await request.json()
        pod = self.pods.get(key)
        if pod is None:
            return web.json_response({"reason": "NotFound"}, status=404)
        if pod["spec"].get("nodeName"):
            return web.json_response({"reason": "Conflict", "message": "pod is already assigned"}, status=409)
        if body.get("kind") != "Binding" or body["target"].get("kind") != "Node":
            return web.json_response({"message": "body is not a Binding to a Node"}, status=400)
        pod["spec"]["nodeName"] = body["target"]["name"]
        self.bindings.append(body)
        self.put_pod(pod)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)
