"""The progress endpoint in DRA mode (issue 30): a pod whose lane came from a claim the agent prepared on this
node may report its progress, though it carries no `tessera.io/assignment` (DRA pods never do).

The whole agent runs (`NodeAgent` with `lanes_api="dra"`): the test plays the kubelet on the DRA socket and
the API server behind `FakeDraApi`; the workloads are separate processes on the real progress socket, put in
their pods through a fake /proc tree, as in the socket trust tests.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tessera.api import contract
from tessera_agent.agent import NodeAgent
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.allocate import progress_endpoint
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import StaticPodSource, pod_info_from_manifest
from tessera_agent.proto import dra_v1_pb2, dra_v1_pb2_grpc

from .peer_support import NODE, FakeProc, Peer, pod_uid
from .test_agent_dra import DEADLINE_S, FakeDraApi, result
from .waiting import until

TRAIN, MATE, STRANGER, OLD = pod_uid(1), pod_uid(2), pod_uid(3), pod_uid(4)


def dra_pod(namespace: str, name: str, uid: str) -> object:
    """A pod as the API server lists it in DRA mode: no Tessera annotation at all."""
    return pod_info_from_manifest(
        {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {"nodeName": NODE}}
    )


def reserved_claim(name: str, uid: str, pods: list[tuple[str, str]]) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "status": {
            "allocation": {"devices": {"results": [result("gpu-0", "4Gi", "25")]}},
            "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods],
        },
    }


@pytest.fixture
def source() -> StaticPodSource:
    return StaticPodSource(
        [
            dra_pod("ml", "train", TRAIN),
            dra_pod("ml", "mate", MATE),  # shares train's claim (a ResourceClaim named by both pods)
            dra_pod("ml", "stranger", STRANGER),  # on the node, no claim prepared for it
        ]
    )


class Running:
    def __init__(self, cfg: AgentConfig, api: FakeDraApi, stop: asyncio.Event, task: asyncio.Task[None]):
        self.cfg, self.api, self.stop, self.task = cfg, api, stop, task

    async def prepare(self, name: str, uid: str) -> dra_v1_pb2.NodePrepareResourcesResponse:
        async with grpc.aio.insecure_channel(f"unix://{self.cfg.dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=uid)]
            )
            resp: dra_v1_pb2.NodePrepareResourcesResponse = await stub.NodePrepareResources(request)
        assert not resp.claims[uid].error, resp
        return resp

    async def unprepare(self, name: str, uid: str) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.cfg.dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=uid)]
            )
            await stub.NodeUnprepareResources(request)


@pytest.fixture
async def agent(plugin_dir: Path, source: StaticPodSource) -> AsyncIterator[Running]:
    cfg = AgentConfig(
        node_name=NODE,
        lanes_api="dra",
        slots_per_gpu=4,
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        progress_socket=plugin_dir / "progress.sock",
        socket_group=os.getgid(),
        proc_root=plugin_dir / "proc",
    )
    api = FakeDraApi()
    node_agent = NodeAgent(cfg, FakeGpuBackend.uniform(1), source, None, AgentMetrics(), dra=api)
    stop = asyncio.Event()
    task = asyncio.create_task(node_agent.run(stop))
    assert cfg.progress_socket is not None
    await until(
        lambda: cfg.dra_registration_socket.exists() and cfg.progress_socket.exists(),  # type: ignore[union-attr]
        "the agent's DRA and progress sockets",
    )
    yield Running(cfg, api, stop, task)
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)


@pytest.fixture
async def peers() -> AsyncIterator[list[Peer]]:
    started: list[Peer] = []
    yield started
    for p in started:
        await p.close()


async def report(
    peers: list[Peer], fake: FakeProc, cfg: AgentConfig, uid: str, name: str
) -> dict[str, object]:
    peer = await Peer.start(fake, uid)
    peers.append(peer)
    endpoint = progress_endpoint(str(cfg.progress_socket), "ml", name)
    return await peer.ask(f"progress {endpoint} 3 10")


async def test_a_pod_with_a_prepared_claim_reports_progress(
    agent: Running, source: StaticPodSource, plugin_dir: Path, peers: list[Peer]
) -> None:
    fake = FakeProc(plugin_dir / "proc")
    agent.api.claims[("ml", "lane-train")] = reserved_claim("lane-train", "claim-1", [("train", TRAIN)])
    await agent.prepare("lane-train", "claim-1")

    reply = await report(peers, fake, agent.cfg, TRAIN, "train")
    assert reply["ok"], reply
    assert json.loads(source.annotations[TRAIN][contract.ANN_PROGRESS])["iterations"] == 3

    # a pod on the node with no claim prepared for it holds no lane: still refused
    reply = await report(peers, fake, agent.cfg, STRANGER, "stranger")
    assert (
        not reply["ok"] and "(403)" in str(reply["error"]) and "holds no Tessera lane" in str(reply["error"])
    )
    assert STRANGER not in source.annotations


async def test_a_second_pod_sharing_a_prepared_claim_is_found_in_its_reservations(
    agent: Running, source: StaticPodSource, plugin_dir: Path, peers: list[Peer]
) -> None:
    """The kubelet prepares a shared claim once, for its first pod; a later pod of the claim is only in the
    claim's status.reservedFor, which the agent reads again when it does not know the pod."""
    fake = FakeProc(plugin_dir / "proc")
    agent.api.claims[("ml", "shared")] = reserved_claim("shared", "claim-2", [("train", TRAIN)])
    await agent.prepare("shared", "claim-2")
    agent.api.claims[("ml", "shared")] = reserved_claim(
        "shared", "claim-2", [("train", TRAIN), ("mate", MATE)]
    )

    reply = await report(peers, fake, agent.cfg, MATE, "mate")
    assert reply["ok"], reply
    assert json.loads(source.annotations[MATE][contract.ANN_PROGRESS])["iterations"] == 3

    # once unprepared (the pods ended), the claim no longer vouches for either pod
    await agent.unprepare("shared", "claim-2")
    reply = await report(peers, fake, agent.cfg, TRAIN, "train")
    assert not reply["ok"] and "(403)" in str(reply["error"]), reply
