"""A fake kubelet: its Registration server on a temporary unix socket, and its PodResources List."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
from tessera.api import contract
from tessera_agent.pods import NodePod, pod_info_from_manifest
from tessera_agent.proto import api_pb2, api_pb2_grpc, podresources_v1_pb2, podresources_v1_pb2_grpc


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """Kubelet's Registration service: records each Register and then dials the plugin back, as kubelet does."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.requests: list[api_pb2.RegisterRequest] = []
        self.registered = asyncio.Event()
        self.generation = 0  # bumped by restart()
        self.generations: list[int] = []  # generation that received each request
        self._server: grpc.aio.Server | None = None

    async def Register(self, request: api_pb2.RegisterRequest, context: object) -> api_pb2.Empty:
        self.requests.append(request)
        self.generations.append(self.generation)
        self.registered.set()
        return api_pb2.Empty()

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def restart(self) -> None:
        """What a new kubelet does (device plugin API): remove every socket in the directory, serve anew."""
        await self.stop()
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink()
        self.registered.clear()
        self.generation += 1
        await self.start()

    def plugin_channel(self) -> grpc.aio.Channel:
        endpoint = self.requests[-1].endpoint
        return grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}")


class FakePodResources(podresources_v1_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources List: what it recorded at each admission."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], list[str]] = {}  # (namespace, name) → device IDs of tessera.io/gpu

    async def List(self, request: object, context: object) -> podresources_v1_pb2.ListPodResourcesResponse:
        return podresources_v1_pb2.ListPodResourcesResponse(
            pod_resources=[
                podresources_v1_pb2.PodResources(
                    namespace=ns,
                    name=name,
                    containers=[
                        podresources_v1_pb2.ContainerResources(
                            name="main",
                            devices=[
                                podresources_v1_pb2.ContainerDevices(
                                    resource_name=contract.RESOURCE_GPU, device_ids=ids
                                ),
                                podresources_v1_pb2.ContainerDevices(
                                    resource_name="example.com/other", device_ids=["x"]
                                ),
                            ],
                        )
                    ],
                )
                for (ns, name), ids in sorted(self.held.items())
            ]
        )


def lane_pod(
    name: str, gpu_uuid: str, gpu_index: int, *, created: str = "2024-01-01T00:00:00Z", node: str = "node-a"
) -> NodePod:
    """A pod the extender bound to one GPU with a 1-slot request, annotated as the real one annotates it."""
    assignment = {
        "node": node,
        "gpuUUIDs": [gpu_uuid],
        "gpuIndices": [gpu_index],
        "laneId": f"lane-{name}",
        "memoryMiB": 2048,
        "computePercent": 25,
    }
    return pod_info_from_manifest(
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": f"uid-{name}",
                "creationTimestamp": created,
                "annotations": {contract.ANN_ASSIGNMENT: json.dumps(assignment)},
            },
            "spec": {"containers": [{"name": "main", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
        }
    )
