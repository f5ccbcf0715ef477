"""The shape of kube-scheduler's extender requests, checked before any decision reads them.

kube-scheduler sends ExtenderArgs (filter, prioritize) and ExtenderBindingArgs (bind) as JSON. Anything
else that reaches the extender — a wrong type where a mapping belongs, a list of numbers for node names, an
annotation that is not a string — is refused here with a BadRequest naming the field, so the handlers answer
400 with the reason instead of failing somewhere inside the view with a 500.
"""

from __future__ import annotations

from typing import Any, Final

from tessera.api import contract

JsonObj = dict[str, Any]

MAX_NODES: Final = 100_000  # nodes in one request; Kubernetes supports 5,000 per cluster
MAX_NAME: Final = 253  # a DNS subdomain, the longest object name Kubernetes allows
MAX_CONTAINERS: Final = 1_000
_RESOURCES: Final = (contract.RESOURCE_GPU, contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU_COMPUTE)


class BadRequest(ValueError):
    """The request body is not what kube-scheduler sends."""


def _mapping(value: Any, where: str, optional: bool = False) -> JsonObj:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _name(value: Any, where: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise BadRequest(f"{where} must be a non-empty string of at most {MAX_NAME} characters")


def check_pod(value: Any) -> JsonObj:
    """The Pod of ExtenderArgs, checked in every field the extender reads."""
    pod = _mapping(value, "Pod")
    meta = _mapping(pod.get("metadata"), "Pod.metadata")
    for key in ("name", "namespace", "uid"):
        _name(meta.get(key), f"Pod.metadata.{key}", optional=key != "name")
    if not isinstance(meta.get("resourceVersion", ""), str):
        raise BadRequest("Pod.metadata.resourceVersion must be a string")
    annotations = _mapping(meta.get("annotations"), "Pod.metadata.annotations", optional=True)
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise BadRequest(
                f"Pod.metadata.annotations[{key!r}] must be a string, got {type(value).__name__}"
            )
    spec = _mapping(pod.get("spec"), "Pod.spec", optional=True)
    containers = spec.get("containers")
    if containers is None:
        return pod
    if not isinstance(containers, list) or len(containers) > MAX_CONTAINERS:
        raise BadRequest(f"Pod.spec.containers must be a list of at most {MAX_CONTAINERS} containers")
    for i, container in enumerate(containers):
        where = f"Pod.spec.containers[{i}]"
        resources = _mapping(_mapping(container, where).get("resources"), f"{where}.resources", optional=True)
        for part in ("requests", "limits"):
            amounts = _mapping(resources.get(part), f"{where}.resources.{part}", optional=True)
            for name in _RESOURCES:
                value = amounts.get(name)
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, str | int | float)
                ):
                    raise BadRequest(f"{where}.resources.{part}[{name!r}] must be a quantity string")
    return pod


def pod_and_nodes(args: JsonObj) -> tuple[JsonObj, list[str], bool]:
    """(pod, node names, whether the names came as NodeNames) from ExtenderArgs."""
    pod = check_pod(args.get("Pod"))
    if args.get("NodeNames") is not None:
        names = args["NodeNames"]
        if not isinstance(names, list) or len(names) > MAX_NODES:
            raise BadRequest(f"NodeNames must be a list of at most {MAX_NODES} node names")
        for i, name in enumerate(names):
            _name(name, f"NodeNames[{i}]")
        return pod, names, True
    nodes = args.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        items = nodes["items"]
        if len(items) > MAX_NODES:
            raise BadRequest(f"Nodes.items must hold at most {MAX_NODES} nodes")
        out = []
        for i, item in enumerate(items):
            meta = _mapping(_mapping(item, f"Nodes.items[{i}]").get("metadata"), f"Nodes.items[{i}].metadata")
            _name(meta.get("name"), f"Nodes.items[{i}].metadata.name")
            out.append(meta["name"])
        return pod, out, False
    raise BadRequest("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes.items")


def binding(args: JsonObj) -> tuple[str, str, str, str]:
    """(namespace, name, uid, node) from ExtenderBindingArgs."""
    for field in ("PodName", "PodNamespace", "PodUID", "Node"):
        if not isinstance(args.get(field), str) or not args[field] or len(args[field]) > MAX_NAME:
            raise BadRequest(
                f"ExtenderBindingArgs needs a non-empty string {field} of at most {MAX_NAME} characters"
            )
    return args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"]
