"""A minimal Kubernetes API server for the extender's calls: list/watch nodes and pods, get and
merge-patch pods, create pods/binding, and get ResourceClaims (`claims`, set by the test).

kmock's KubernetesEmulator has no `pods/binding` subresource (create a Binding → sets spec.nodeName), which
the extender's bind needs, so these tests use this small aiohttp server instead.

Watches keep the real API server's resourceVersion contract, which a client's list-then-watch relies on: a
watch from a list's resourceVersion first gets every change made after that list (even one made before the
watch was opened), a watch without one starts with an ADDED event per object, and one from a version older
than the kept history gets a 410 Gone ERROR event. Tests can also end watches as the server does on its
request timeout (`end_watches`) or expire them as after an etcd compaction (`expire_watches`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

JsonObj = dict[str, Any]
KINDS = ("nodes", "pods")


class FakeApiServer:
    def __init__(self) -> None:
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[str, JsonObj] = {}
        self.bindings: list[JsonObj] = []
        self.claims: dict[str, JsonObj] = {}  # "namespace/name" → ResourceClaim, read by GET only
        self.rv = 1
        self.lists = dict.fromkeys(KINDS, 0)  # list requests served, per kind
        self.watches = dict.fromkeys(KINDS, 0)  # watch requests served, per kind
        self.after_list: dict[str, Callable[[], None]] = {}  # kind → run once after its next list
        self._history: dict[str, list[tuple[int, JsonObj]]] = {k: [] for k in KINDS}  # (rv, event)
        self._oldest = dict.fromkeys(KINDS, 0)  # watches from a version below this get 410 Gone
        self._watchers: dict[str, list[asyncio.Queue[JsonObj | None]]] = {k: [] for k in KINDS}

    def _bump(self, obj: JsonObj) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def _emit(self, kind: str, event: str, obj: JsonObj) -> None:
        self._history[kind].append((self.rv, {"type": event, "object": json.loads(json.dumps(obj))}))
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
        self._bump(pod)  # a deletion is a change with its own resourceVersion, like any other
        self._emit("pods", "DELETED", pod)

    def end_watches(self, kind: str) -> None:
        """Close the open watches of `kind` cleanly, as the server does when a watch's timeout runs out."""
        for q in self._watchers[kind]:
            q.put_nowait(None)

    def expire_watches(self, kind: str) -> None:
        """Forget the history of `kind` and end its watches with 410 Gone (as after an etcd compaction)."""
        self._oldest[kind] = self.rv
        self._history[kind].clear()
        for q in self._watchers[kind]:
            q.put_nowait(_gone(self.rv))
            q.put_nowait(None)

    def open_watches(self, kind: str) -> int:
        return len(self._watchers[kind])

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self._list("nodes"))
        app.router.add_get("/api/v1/pods", self._list("pods"))
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch_pod)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self._bind)
        app.router.add_get("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", self._get_claim)
        return app

    def _list(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            store = self.nodes if kind == "nodes" else self.pods
            if request.query.get("watch") != "true":
                self.lists[kind] += 1
                body = {
                    "kind": "List",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": list(store.values()),
                }
                resp = web.json_response(body)
                hook = self.after_list.pop(kind, None)
                if hook is not None:
                    hook()  # a change the list did not see, made before the client can open its watch
                return resp
            self.watches[kind] += 1
            # The backlog and the queue for later events are taken together (no await between): no gap.
            q: asyncio.Queue[JsonObj | None] = asyncio.Queue()
            since = request.query.get("resourceVersion")
            if not since:
                backlog = [{"type": "ADDED", "object": json.loads(json.dumps(o))} for o in store.values()]
            elif int(since) < self._oldest[kind]:
                backlog = [_gone(self.rv)]
                q.put_nowait(None)
            else:
                backlog = [e for rv, e in self._history[kind] if rv > int(since)]
            for event in backlog:
                q.put_nowait(event)
            self._watchers[kind].append(q)
            resp = web.StreamResponse()
            try:
                await resp.prepare(request)
                while (event := await q.get()) is not None:
                    await resp.write((json.dumps(event) + "\n").encode())
            finally:
                self._watchers[kind].remove(q)
            return resp

        return handle

    async def _get_pod(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        if key not in self.pods:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(self.pods[key])

    async def _get_claim(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        if key not in self.claims:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(self.claims[key])

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


def _gone(rv: int) -> JsonObj:
    message = f"too old resource version (current {rv})"
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return {"type": "ERROR", "object": {**status, "reason": "Expired", "code": 410}}
