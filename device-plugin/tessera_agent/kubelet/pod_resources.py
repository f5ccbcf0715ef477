"""The kubelet's PodResources API v1 over its unix socket: which devices each pod's containers were given.

This is the kubelet's own record, written when it admitted the pod, so the lane audit (`lane_audit.py`) can check
after the fact that a container received the lane of its own pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import grpc  # type: ignore[import-untyped]

from tessera_agent.proto import podresources_v1_pb2, podresources_v1_pb2_grpc


class PodResourcesUnavailable(RuntimeError):
    """The kubelet's PodResources socket could not be read (absent, not mounted, or not answering)."""


class DeviceHolders(Protocol):
    async def devices(self) -> Mapping[str, tuple[str, ...]]:
        """`namespace/name` → the device IDs of the agent's resource that the pod's containers hold."""
        ...


class KubeletPodResources(DeviceHolders):
    def __init__(self, socket: Path, resource_name: str, timeout_s: float = 10.0) -> None:
        self.socket = socket
        self.resource_name = resource_name
        self.timeout_s = timeout_s

    async def devices(self) -> dict[str, tuple[str, ...]]:
        if not self.socket.exists():
            raise PodResourcesUnavailable(
                f"{self.socket} does not exist (is the kubelet's pod-resources directory mounted into the agent?)"
            )
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.socket}") as channel:
                stub = podresources_v1_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                resp = await stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise PodResourcesUnavailable(f"{self.socket}: {err.code().name}: {err.details()}") from None
        return held_devices(resp, self.resource_name)


def held_devices(
    resp: podresources_v1_pb2.ListPodResourcesResponse, resource_name: str
) -> dict[str, tuple[str, ...]]:
    """Per pod, the sorted device IDs of `resource_name` over all its containers (pods holding none left out)."""
    out: dict[str, tuple[str, ...]] = {}
    for pod in resp.pod_resources:
        ids = sorted(
            d
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name == resource_name
            for d in devices.device_ids
        )
        if ids:
            out[f"{pod.namespace}/{pod.name}"] = tuple(ids)
    return out
