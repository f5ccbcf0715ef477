"""Every component under the chart's own ServiceAccount and RBAC on the real API server, never as admin.

Each component runs its real code paths with a token of its ServiceAccount; the API server's audit log
then says what each one asked for, as the authorizer saw it (verb, resource, namespace, response code).
A test fails on any request the server refused (403) and on any grant of the chart's roles that no
request used, so a missing permission and a needless one both show up here.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from tessera.api import contract
from tessera.sdk import report_progress
from tessera_agent.agent import NodeAgent
from tessera_agent.allocate import progress_endpoint
from tessera_agent.backend import MIB, GpuInfo
from tessera_agent.config import AgentConfig
from tessera_agent.fake_backend import FakeGpuBackend
from tessera_agent.inventory import KubernetesNodePatcher
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import KubernetesPodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc

from tests.integration.agent.agent_fake_kubelet import FakeKubelet

from .conftest import RELEASE_NS, Credentials, Nodes, Scheduling, chart_objects, wait_for
from .controlplane import ControlPlane
from .test_scheduling import fractional_pod

Call = tuple[str, str, str]  # (API group, resource[/subresource], verb): what an RBAC rule grants


def sa_user(service_account: str, namespace: str = RELEASE_NS) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


def resource_requests(
    cluster: ControlPlane, user: str, user_agent: str | None = None
) -> list[dict[str, Any]]:
    """Audit events of `user`'s resource requests (discovery needs no grant), optionally of one client."""
    return [
        e
        for e in cluster.audit(user)
        if "objectRef" in e and (user_agent is None or e.get("userAgent", "").startswith(user_agent))
    ]


def call_of(event: dict[str, Any]) -> Call:
    ref = event["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return (ref.get("apiGroup", ""), resource, event["verb"])


def forbidden(events: list[dict[str, Any]]) -> list[str]:
    return sorted(
        {
            f"{e['verb']} {e['requestURI'].split('?')[0]}"
            for e in events
            if e.get("responseStatus", {}).get("code") == 403
        }
    )


def triples(rules: list[dict[str, Any]]) -> set[Call]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def cluster_grants(objs: list[dict[str, Any]], service_account: str) -> set[Call]:
    """What the chart's own ClusterRoles give `service_account` through its ClusterRoleBindings."""
    roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole"}
    out: set[Call] = set()
    for binding in (o for o in objs if o["kind"] == "ClusterRoleBinding"):
        if any(s["name"] == service_account for s in binding["subjects"]):
            role = roles.get(binding["roleRef"]["name"])
            if role is not None:  # built-in roles (system:kube-scheduler) are not the chart's to trim
                out |= triples(role["rules"])
    return out


# --- the node agent ------------------------------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tsr-", dir="/tmp"))  # unix socket paths are capped at 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def agent_api(creds: Credentials) -> k8s_client.CoreV1Api:
    return k8s_client.CoreV1Api(k8s_config.new_client_from_config(config_file=str(creds.kubeconfig)))


async def test_node_agent_allocates_and_publishes_under_its_service_account(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
    sock_dir: Path,
) -> None:
    """The agent's whole Kubernetes path on one node: publish the GPU inventory, find the pod kubelet asks
    it to Allocate for (bound by the real scheduler through the extender), mark it allocated, and write the
    progress a workload reports. Allocate used to fail here: the chart never granted `pods patch`."""
    creds = chart_rbac["agent"]
    node = nodes.add(f"agent-{secrets.token_hex(3)}", gpus=2, slots_per_gpu=4)
    # The node's GPUs as the node fixture announced them, so the agent rewrites the same inventory.
    backend = FakeGpuBackend([GpuInfo(i, f"GPU-{node}-{i}", "V100", 16384 * MIB, 0) for i in range(2)])
    api = agent_api(creds)
    kubelet = FakeKubelet(sock_dir)
    await kubelet.start()
    cfg = AgentConfig(
        node_name=node, device_plugin_dir=sock_dir, slots_per_gpu=4, progress_socket=sock_dir / "p.sock"
    )
    agent = NodeAgent(
        cfg,
        backend,
        KubernetesPodSource(api),
        KubernetesNodePatcher(api),
        AgentMetrics(),
        sample_interval_s=0.5,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    user = sa_user(creds.service_account)
    try:
        await wait_for(
            lambda: any(call_of(e) == ("", "nodes", "patch") for e in resource_requests(cluster, user)),
            90,
            "the agent to publish its node's inventory",
        )
        await asyncio.wait_for(kubelet.registered.wait(), 60)
        status, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", fractional_pod("train", "4096", 30)
        )
        assert status == 201, body

        def bound() -> Any:
            pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
            return pod if pod and pod["spec"].get("nodeName") else None

        pod = await wait_for(bound, 90, "the pod to be bound through the extender")
        assignment = json.loads(pod["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
        uuid = assignment["gpuUUIDs"][0]
        async with kubelet.plugin_channel() as channel:
            try:
                resp = await api_pb2_grpc.DevicePluginStub(channel).Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}::1"])]
                    ),
                    timeout=60,
                )
            except grpc.aio.AioRpcError as err:
                raise AssertionError(f"Allocate failed: {err.details()}") from err
        envs = dict(resp.container_responses[0].envs)
        assert envs[contract.ENV_CUDA_VISIBLE_DEVICES] == uuid
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
        assert pod["metadata"]["annotations"][contract.ANN_ALLOCATED] == f"{uuid}::1"

        # The workload reports progress through the agent's socket; the agent writes it on the pod.
        endpoint = progress_endpoint(str(cfg.progress_socket), namespace, "train")
        await asyncio.to_thread(report_progress, 5, 10, endpoint=endpoint)
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
        assert json.loads(pod["metadata"]["annotations"][contract.ANN_PROGRESS])["iterations"] == 5
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await kubelet.stop()
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/train?gracePeriodSeconds=0")

    events = resource_requests(cluster, user)
    assert forbidden(events) == []
    used = {call_of(e) for e in events}
    granted = cluster_grants(chart_objects(), creds.service_account)
    assert used - granted == set(), "calls the chart does not grant"
    assert granted - used == set(), "grants the agent never uses"
