"""Every component under the chart's own ServiceAccount and RBAC on the real API server, never as admin.

Each component runs its real code paths with a token of its ServiceAccount; the API server's audit log
then says what each one asked for, as the authorizer saw it (verb, resource, namespace, response code).
A test fails on any request the server refused (403) and on any grant of the chart's roles that no
request used, so a missing permission and a needless one both show up here.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo as InventoryGpu
from tessera.api.gpu_inventory import parse_node_gpus
from tessera.kube import KubeClient, KubeConfig
from tessera.sdk import report_progress
from tessera_agent.agent import NodeAgent
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.gpus.inventory import KubernetesNodePatcher
from tessera_agent.kubelet.allocate import progress_endpoint
from tessera_agent.kubelet.lane_audit import LaneAudit
from tessera_agent.kubelet.pod_resources import KubeletPodResources
from tessera_agent.lanes.restarts import KubernetesEventSink
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import KubernetesPodSource
from tessera_agent.proto import api_pb2, api_pb2_grpc, podresources_v1_pb2_grpc

from tests.integration.agent.agent_fake_kubelet import FakeKubelet, FakePodResources
from tests.integration.agent.peer_support import FakeProc
from tests.ports import free_port
from tests.unit.chart.chart_render import objects, render

from .conftest import (
    RBAC_KINDS,
    RELEASE_NS,
    Credentials,
    Nodes,
    Scheduling,
    chart_objects,
    request_token,
    run_scheduling,
    running_operator,
    wait_for,
)
from .controlplane import ROOT, ControlPlane, default_scheduler, wait_until
from .test_scheduling import fractional_pod

Call = tuple[str, str, str]  # (API group, resource[/subresource], verb): what an RBAC rule grants


def sa_user(service_account: str, namespace: str = RELEASE_NS) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


class Audit:
    """One user's resource requests as the API server's audit log recorded them, from the moment this is
    made on (the log is append-only, so earlier tests' requests are left out). Discovery (/api, /apis,
    /version) is not a resource request and needs no grant."""

    def __init__(self, cluster: ControlPlane, user: str, *, since: int | None = None) -> None:
        self.cluster, self.user = cluster, user
        self.offset = cluster.audit_offset() if since is None else since

    def events(
        self, user_agent: str | None = None, *, exclude_agent: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            e
            for e in self.cluster.audit(self.user, self.offset)
            if "objectRef" in e
            and (user_agent is None or e.get("userAgent", "").startswith(user_agent))
            and (exclude_agent is None or not e.get("userAgent", "").startswith(exclude_agent))
        ]


def call_of(event: dict[str, Any]) -> Call:
    ref = event["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return (ref.get("apiGroup", ""), resource, event["verb"])


def calls(events: list[dict[str, Any]], namespace: str | None = None) -> set[Call]:
    """The calls made in `namespace`, or (None) on cluster-scoped resources and across all namespaces."""
    return {call_of(e) for e in events if e["objectRef"].get("namespace") == namespace}


def forbidden(events: list[dict[str, Any]]) -> list[str]:
    """Requests the authorizer refused. A 403 from admission (e.g. a create in a namespace being deleted,
    which a cluster-wide operator may meet in a shared test cluster) is no missing permission."""
    return sorted(
        {
            f"{e['verb']} {e['requestURI'].split('?')[0]}"
            for e in events
            if e.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid"
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


def grants(objs: list[dict[str, Any]], service_account: str, kind: str = "ClusterRole") -> set[Call]:
    """What the chart's own ClusterRoles (or Roles) give `service_account` through its bindings."""
    roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}
    out: set[Call] = set()
    for binding in (o for o in objs if o["kind"] == f"{kind}Binding"):
        if binding["roleRef"]["kind"] == kind and any(
            s["name"] == service_account for s in binding["subjects"]
        ):
            role = roles.get(binding["roleRef"]["name"])
            if role is not None:  # built-in roles (system:kube-scheduler) are not the chart's to trim
                out |= triples(role["rules"])
    return out


def assert_exact(used: set[Call], granted: set[Call], who: str) -> None:
    assert not used - granted, f"{who} makes calls the chart does not grant: {sorted(used - granted)}"
    assert not granted - used, f"the chart grants {who} calls it never makes: {sorted(granted - used)}"


# --- the node agent ------------------------------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tsr-", dir="/tmp"))  # unix socket paths are capped at 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def node_gpus(cluster: ControlPlane, node: str) -> list[InventoryGpu]:
    annotations = (cluster.get(f"/api/v1/nodes/{node}") or {}).get("metadata", {}).get("annotations", {})
    return parse_node_gpus(annotations.get(contract.ANN_NODE_GPUS, "[]"), node=node)


def agent_api(creds: Credentials) -> KubeClient:
    """The agent's own client (tessera.kube), with the ServiceAccount's token."""
    return KubeClient(KubeConfig.from_kubeconfig(creds.kubeconfig))


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
    # The node's GPUs as the node fixture announced them, with the driver's reserve that NVML reports:
    # the agent publishes 16384 - 512 MiB usable per GPU.
    backend = FakeGpuBackend(
        [GpuDevice(i, f"GPU-{node}-{i}", "V100", 16384 * MIB, 512 * MIB, minor=i) for i in range(2)]
    )
    api = agent_api(creds)
    kubelet = FakeKubelet(sock_dir)
    await kubelet.start()
    # The agent maps each socket peer to its pod through /proc/<pid>/cgroup; the workload here is this test
    # process, put in the pod's cgroup in a fake /proc tree as kubelet would.
    proc = FakeProc(sock_dir / "proc")
    cfg = AgentConfig(
        node_name=node,
        device_plugin_dir=sock_dir,
        slots_per_gpu=4,
        mps_root=sock_dir / "mps",  # the lanes' own directories, not the host's /run
        progress_socket=sock_dir / "p.sock",
        proc_root=proc.root,
    )
    agent = NodeAgent(
        cfg,
        backend,
        KubernetesPodSource(api),
        KubernetesNodePatcher(api),
        AgentMetrics(),
        sample_interval_s=0.5,
    )
    audit = Audit(cluster, sa_user(creds.service_account))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(
            lambda: [g.memory_mib for g in node_gpus(cluster, node)] == [15872, 15872],
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
        proc.place(os.getpid(), pod["metadata"]["uid"])
        endpoint = progress_endpoint(str(cfg.progress_socket), namespace, "train")
        await asyncio.to_thread(report_progress, 5, 10, endpoint=endpoint)
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
        assert json.loads(pod["metadata"]["annotations"][contract.ANN_PROGRESS])["iterations"] == 5

        # The lane audit: the kubelet says the container holds a slot Allocate did not serve it with; the
        # agent says so in events on the pod and the node, and deletes the pod (its UID as precondition).
        resources = FakePodResources()
        resources.held[(namespace, "train")] = [f"{uuid}::2"]
        server = grpc.aio.server()
        podresources_v1_pb2_grpc.add_PodResourcesListerServicer_to_server(resources, server)
        server.add_insecure_port(f"unix://{sock_dir / 'pr.sock'}")
        await server.start()
        lane_audit = LaneAudit(
            node,
            KubeletPodResources(sock_dir / "pr.sock", contract.RESOURCE_GPU),
            KubernetesPodSource(api),
            KubernetesEventSink(api, node),
            api,
        )
        try:
            assert await lane_audit.check() == []  # seen once
            (mismatch,) = await lane_audit.check()
        finally:
            await server.stop(0)
        assert mismatch.pod.key == f"{namespace}/train"
        # deleted: gone, or terminating (no kubelet here confirms the deletion)
        gone = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
        assert gone is None or gone["metadata"].get("deletionTimestamp"), (
            "the pod on the wrong lane was not deleted"
        )
        reasons = {
            (e["involvedObject"]["kind"], e["reason"])
            for ns in (namespace, "default")
            for e in cluster.get(f"/api/v1/namespaces/{ns}/events")["items"]
            if e.get("reportingComponent") == "tessera-agent"
        }
        assert {("Pod", "LaneMismatch"), ("Node", "LaneMismatch")} <= reasons
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await kubelet.stop()
        await api.close()
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/train?gracePeriodSeconds=0")

    events = audit.events()
    assert forbidden(events) == []
    used = {call_of(e) for e in events}  # pods are patched in the workload's namespace, listed cluster-wide
    assert_exact(used, grants(chart_objects(), creds.service_account), "the node agent")


# --- the operator ----------------------------------------------------------------------------------------

TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "trainer:1"}]}}


def app(name: str) -> dict[str, Any]:
    jobs = [{"name": "j1", "iterTotal": 1000, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1}]
    return {"apiVersion": contract.API_VERSION, "kind": "App", "metadata": {"name": name},
            "spec": {"template": TEMPLATE, "jobs": jobs}}  # fmt: skip


def trialgroup(name: str) -> dict[str, Any]:
    trials = [
        {"name": f"t{i}", "budgetIterations": 9, "iterTimeSeconds": 1.0, "config": {}} for i in range(2)
    ]
    return {"apiVersion": contract.API_VERSION, "kind": "TrialGroup", "metadata": {"name": name},
            "spec": {"template": TEMPLATE, "trials": trials, "gpus": 1}}  # fmt: skip


def modeldeployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}},
            "model": {"name": "resnet", "dynamic": False},
            "slo": {"latencyMs": 100},
            "traffic": {"expectedRps": 50},
            "batching": {
                "supportedBatchSizes": [1, 2, 4, 8],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15, 25, 45]},
            },
            "gpu": {"lane": {"memoryMiB": 4096, "computePercent": 50}},
        },
    }


def cr_path(namespace: str, plural: str, name: str = "") -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{plural}" + (
        f"/{name}" if name else ""
    )


def pods_labelled(cluster: ControlPlane, namespace: str, label: str, value: str) -> list[dict[str, Any]]:
    body = cluster.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={label}%3D{value}")
    return [p for p in (body or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")]


async def exercise_operator(
    cluster: ControlPlane, ctl: Any, namespace: str, *, replace_workers: bool = False
) -> None:
    """Every code path of the operator that talks to the API: an App's pods, leases and status, a
    TrialGroup's pool and trial pods, a ModelDeployment's workers and gateway (created, then patched
    when its spec changes), events, the cleanup of all three on delete, and a team Queue serving the
    namespace (Queues and Namespaces watched, the Queue's status written). `replace_workers`: a new lane
    size also replaces the ModelDeployment's workers (pods deleted by a pod sync, not by a cleanup)."""
    queue = f"rbac-{secrets.token_hex(3)}"
    queues = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_QUEUE}"
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": queue},
        "spec": {"guaranteedGPUs": 1},
    }
    status, out = cluster.request("POST", queues, body)
    assert status == 201, out
    status, out = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {contract.LABEL_QUEUE: queue}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, out
    try:
        await _queued_job(cluster, namespace)
        await _exercise(cluster, namespace, replace_workers)
        await wait_for(
            lambda: (
                ((cluster.get(f"{queues}/{queue}") or {}).get("status") or {}).get("namespaces")
                == [namespace]
            ),
            120,
            "the Queue's status",
        )
    finally:
        cluster.request("DELETE", f"{queues}/{queue}")


async def _queued_job(cluster: ControlPlane, namespace: str) -> None:
    """A batch/v1 Job whose pod waits in the namespace's queue: gated and labelled in its own template (as
    the chart's queue admission policy would make it). The operator reads the Job and takes the gate off."""
    gpu = {"limits": {contract.RESOURCE_GPU: "1"}}
    spec = {
        "parallelism": 1,
        "template": {
            "metadata": {"labels": {contract.LABEL_QUEUED: "true"}},
            "spec": {
                "restartPolicy": "Never",
                "schedulerName": contract.SCHEDULER_NAME,
                "schedulingGates": [{"name": contract.SCHEDULING_GATE_QUEUE}],
                "containers": [{"name": "c", "image": "x:1", "resources": gpu}],
            },
        },
    }
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    status, out = cluster.request("POST", jobs, {"metadata": {"name": "queued"}, "spec": spec})
    assert status == 201, out
    selector = f"/api/v1/namespaces/{namespace}/pods?labelSelector=batch.kubernetes.io/job-name%3Dqueued"

    def admitted() -> bool:
        pods = (cluster.get(selector) or {}).get("items") or []
        return bool(pods) and all(not p["spec"].get("schedulingGates") for p in pods)

    await wait_for(admitted, 120, "the Job's pod admitted")
    # Its pod, never bound, goes with it at once.
    status, out = cluster.request("DELETE", f"{jobs}/queued?propagationPolicy=Background")
    assert status == 200, out


def md_workers(cluster: ControlPlane, namespace: str) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in pods_labelled(cluster, namespace, contract.LABEL_MODELDEPLOYMENT, "md")
        if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "worker"
    }


async def _replace_workers(cluster: ControlPlane, namespace: str) -> None:
    old = await wait_for(lambda: md_workers(cluster, namespace), 120, "the ModelDeployment's workers")
    status, out = cluster.request(
        "PATCH",
        cr_path(namespace, contract.PLURAL_MODELDEPLOYMENT, "md"),
        {"spec": {"gpu": {"lane": {"memoryMiB": 2048}}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, out
    await wait_for(
        lambda: (now := md_workers(cluster, namespace)) and not now & old, 120, "workers of the new lane size"
    )


async def _exercise(cluster: ControlPlane, namespace: str, replace_workers: bool = False) -> None:
    for plural, body in (
        (contract.PLURAL_APP, app("a")),
        (contract.PLURAL_TRIALGROUP, trialgroup("tg")),
        (contract.PLURAL_MODELDEPLOYMENT, modeldeployment("md")),
    ):
        status, out = cluster.request("POST", cr_path(namespace, plural), body)
        assert status == 201, out
    await wait_for(lambda: pods_labelled(cluster, namespace, contract.LABEL_APP, "a"), 120, "the App's pods")
    await wait_for(
        lambda: pods_labelled(cluster, namespace, contract.LABEL_TRIALGROUP, "tg"), 120, "the trial pods"
    )
    gateway = f"/apis/apps/v1/namespaces/{namespace}/deployments/md-gateway"
    await wait_for(lambda: cluster.get(gateway), 120, "the gateway Deployment")
    await wait_for(
        lambda: (
            (cluster.get(cr_path(namespace, contract.PLURAL_APP, "a")) or {}).get("status", {}).get("phase")
        ),
        120,
        "the App's status",
    )
    # A new SLO changes the gateway's config: the operator re-applies (patches) its objects.
    status, out = cluster.request(
        "PATCH",
        cr_path(namespace, contract.PLURAL_MODELDEPLOYMENT, "md"),
        {"spec": {"slo": {"latencyMs": 120}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, out
    configmap = f"/api/v1/namespaces/{namespace}/configmaps/md-gateway"

    def slo_s() -> float:
        data = (cluster.get(configmap) or {}).get("data") or {}
        return float(json.loads(data.get("gateway.json", "{}")).get("models", [{}])[0].get("slo_s", 0))

    await wait_for(lambda: slo_s() == 0.12, 120, "the gateway config to follow the new SLO")
    if replace_workers:
        await _replace_workers(cluster, namespace)
    for plural, name in (
        (contract.PLURAL_APP, "a"),
        (contract.PLURAL_TRIALGROUP, "tg"),
        (contract.PLURAL_MODELDEPLOYMENT, "md"),
    ):
        status, out = cluster.request("DELETE", cr_path(namespace, plural, name))
        assert status == 200, out
    for plural, name in (
        (contract.PLURAL_APP, "a"),
        (contract.PLURAL_TRIALGROUP, "tg"),
        (contract.PLURAL_MODELDEPLOYMENT, "md"),
    ):
        await wait_for(
            lambda p=plural, n=name: cluster.request("GET", cr_path(namespace, p, n))[0] == 404,
            120,
            f"{plural}/{name} to be cleaned up and gone",
        )
    await wait_for(lambda: cluster.request("GET", gateway)[0] == 404, 120, "the gateway to be deleted")


async def test_operator_runs_under_its_cluster_role(
    crds: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    """The default install (allNamespaces): the operator serves every namespace and elects its leader
    through a ClusterKopfPeering, with exactly the grants of its ClusterRole."""
    cluster = crds
    creds = chart_rbac["operator"]
    peering = f"rbac-{secrets.token_hex(3)}"  # not the chart's default name: a release may own that one
    status, out = cluster.request(
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}},
    )
    assert status == 201, out
    nodes.add(f"op-{secrets.token_hex(3)}", gpus=4)
    audit = Audit(cluster, sa_user(creds.service_account))
    try:
        async with running_operator(
            cluster, creds, standalone=False, peering_name=peering, priority=1
        ) as ctl:
            await exercise_operator(cluster, ctl, namespace)
    finally:
        cluster.request("DELETE", f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}")

    events = audit.events()
    assert forbidden(events) == []
    used = {call_of(e) for e in events}
    assert_exact(used, grants(chart_objects(), creds.service_account), "the operator")
    assert not grants(chart_objects(), creds.service_account, "Role")


def release_objects(name: str, namespace: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    return objects(render(values, name=name, namespace=namespace))


async def test_operator_of_one_namespace_runs_under_a_role_there(
    crds: ControlPlane, nodes: Nodes, namespace: str
) -> None:
    """operator.allNamespaces=false: the operator serves the release namespace under a Role there; its
    ClusterRole keeps only cluster-scoped reads (nodes, CRDs, namespaces). Run it under that RBAC, from a
    release of its own into a fresh namespace, and check every request against where it was granted."""
    cluster = crds
    release = f"ns-{secrets.token_hex(3)}"
    objs = release_objects(release, namespace, {"operator": {"allNamespaces": False}})
    mine = [
        o
        for o in objs
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "operator"
        and o["kind"] in (*RBAC_KINDS, "KopfPeering")
    ]
    assert {o["kind"] for o in mine} == {*RBAC_KINDS, "KopfPeering"}
    cluster.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(o) for o in mine))
    (sa,) = [o["metadata"]["name"] for o in mine if o["kind"] == "ServiceAccount"]
    (peering,) = [o["metadata"]["name"] for o in mine if o["kind"] == "KopfPeering"]
    token = request_token(cluster, namespace, sa)
    creds = Credentials(
        sa, token, cluster.write_kubeconfig(cluster.workdir / f"{release}.kubeconfig", token=token)
    )
    # An App in a namespace the operator does not serve: it must not be touched (nor tried).
    elsewhere = f"t-{secrets.token_hex(4)}"
    cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": elsewhere}})
    status, out = cluster.request("POST", cr_path(elsewhere, contract.PLURAL_APP), app("other"))
    assert status == 201, out
    nodes.add(f"opns-{secrets.token_hex(3)}", gpus=4)
    audit = Audit(cluster, sa_user(sa, namespace))
    try:
        async with running_operator(
            cluster,
            creds,
            clusterwide=False,
            namespaces=(namespace,),
            standalone=False,
            peering_name=peering,
            priority=1,
        ) as ctl:
            await exercise_operator(cluster, ctl, namespace)
        other = cluster.get(cr_path(elsewhere, contract.PLURAL_APP, "other"))
        assert not other["metadata"].get("finalizers") and "status" not in other
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{elsewhere}")
        for o in mine:
            if o["kind"].startswith("Cluster"):
                cluster.kubectl("delete", o["kind"].lower(), o["metadata"]["name"], "--ignore-not-found")

    events = audit.events()
    assert forbidden(events) == []
    assert {e["objectRef"].get("namespace") for e in events} <= {None, namespace}
    assert_exact(calls(events, None), grants(objs, sa), "the operator, cluster-wide,")
    assert_exact(calls(events, namespace), grants(objs, sa, "Role"), f"the operator, in {namespace},")


# --- the extender ----------------------------------------------------------------------------------------


def test_extender_binds_under_the_scheduler_service_account(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    """kube-scheduler and the extender share the scheduler's ServiceAccount: neither may be refused, and
    the extender's own ClusterRole holds exactly what the extender calls (the built-in scheduler roles
    cover kube-scheduler). Its requests are told apart from kube-scheduler's by their user agent."""
    creds = chart_rbac["scheduler"]
    # From the extender's start (it lists then), not before: earlier tests ran extenders under this account too.
    audit = Audit(cluster, sa_user(creds.service_account), since=scheduling.audit_offset)
    node = nodes.add(f"ext-{secrets.token_hex(3)}", gpus=2)
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", fractional_pod("p", "4096", 25)
    )
    assert status == 201, body

    def bound() -> Any:
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/p")
        return pod if pod and pod["spec"].get("nodeName") else None

    wait_until(bound, 90, "the pod to be bound through the extender", scheduling.scheduler)
    # A bind for a pod the extender has not seen makes it read the pod from the API server: a 404, not a 403.
    request = urllib.request.Request(
        f"{scheduling.extender_url}/bind",
        data=json.dumps(
            {"PodName": "ghost", "PodNamespace": namespace, "PodUID": "u", "Node": node}
        ).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert json.loads(resp.read())["Error"] == f"pod {namespace}/ghost not found"

    assert forbidden(audit.events()) == []  # kube-scheduler's requests included
    extender = audit.events(exclude_agent="kube-scheduler/")
    assert_exact(
        {call_of(e) for e in extender}, grants(chart_objects(), creds.service_account), "the extender"
    )


def test_charts_kube_scheduler_leads_and_schedules_under_its_roles(
    cluster: ControlPlane, scheduling: Scheduling, nodes: Nodes, namespace: str
) -> None:
    """The chart's own KubeSchedulerConfiguration (leader election on, its Lease in the release namespace)
    on the real kube-scheduler under a release's scheduler ServiceAccount: it takes the Lease through the
    leader-election Role, reads the authentication ConfigMap through the kube-system RoleBinding, and binds
    a pod through the extender; nothing is refused and the Role's grants are all used."""
    release, scheduler_name = f"le-{secrets.token_hex(3)}", f"tessera-{secrets.token_hex(3)}"
    objs = release_objects(release, namespace, {"scheduler": {"schedulerName": scheduler_name}})
    mine = [
        o
        for o in objs
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "scheduler"
        and o["kind"] in RBAC_KINDS
    ]
    cluster.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(o) for o in mine))
    (sa,) = [o["metadata"]["name"] for o in mine if o["kind"] == "ServiceAccount"]
    token = request_token(cluster, namespace, sa)
    kubeconfig = cluster.write_kubeconfig(cluster.workdir / f"{release}.kubeconfig", token=token)
    (configmap,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config")]
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert config["leaderElection"]["leaderElect"] is True
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config["extenders"][0]["urlPrefix"] = scheduling.extender_url  # the pod's localhost, here
    path = cluster.workdir / f"{release}-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    audit = Audit(cluster, sa_user(sa, namespace))
    sched = cluster.spawn(
        f"kube-scheduler-{release}",
        # In its pod, kube-scheduler delegates authentication and authorization of its own endpoints to
        # the API server with the in-cluster credentials; here the kubeconfig stands in for them.
        [str(cluster.assets / "kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1",
         f"--secure-port={free_port()}", f"--authentication-kubeconfig={kubeconfig}",
         f"--authorization-kubeconfig={kubeconfig}", "-v=2"],
    )  # fmt: skip
    try:
        lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{scheduler_name}"
        held = wait_until(
            lambda: (cluster.get(lease) or {}).get("spec", {}).get("holderIdentity"), 90, "the Lease", sched
        )
        node = nodes.add(f"le-{secrets.token_hex(3)}", gpus=1)
        pod = fractional_pod("p", "4096", 25)
        pod["spec"]["schedulerName"] = scheduler_name
        status, body = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert status == 201, body
        wait_until(
            lambda: (
                (cluster.get(f"/api/v1/namespaces/{namespace}/pods/p") or {}).get("spec", {}).get("nodeName")
                == node
            ),
            90,
            "the pod to be bound by the elected scheduler",
            sched,
        )
        # A renewal: the holder updates the Lease it took.
        renewed = cluster.get(lease)["spec"]["renewTime"]
        wait_until(lambda: cluster.get(lease)["spec"]["renewTime"] != renewed, 60, "a Lease renewal", sched)
        assert cluster.get(lease)["spec"]["holderIdentity"] == held
    finally:
        sched.stop()
        for o in mine:
            if o["kind"].startswith("Cluster") or o["metadata"].get("namespace") == "kube-system":
                scope = ["-n", "kube-system"] if o["metadata"].get("namespace") else []
                cluster.kubectl(
                    "delete", *scope, o["kind"].lower(), o["metadata"]["name"], "--ignore-not-found"
                )

    events = audit.events()
    assert forbidden(events) == []
    leases = {c for c in calls(events, namespace) if c[1] == "leases"}
    assert_exact(leases, grants(objs, sa, "Role"), "kube-scheduler's leader election")
    # The kube-system RoleBinding: the built-in reader Role of extension-apiserver-authentication.
    assert ("", "configmaps", "get") in calls(events, "kube-system")


# --- the node agent's BE feedback loop (agent.lanes.feedback) ------------------------------------------

# Its own ClusterRole and ServiceAccount: the default release's, which other tests check, stay as they are.
FEEDBACK_RELEASE = "tessera-fb"
FEEDBACK_VALUES = {"agent": {"lanes": {"hpBe": True, "feedback": {"enabled": True}}}}


@pytest.fixture(scope="module")
def feedback_rbac(crds: ControlPlane) -> tuple[list[dict[str, Any]], Credentials]:
    """The chart's RBAC rendered with the feedback loop on (release `tessera-fb`); the agent's objects and
    credentials."""
    crds.kubectl("create", "namespace", RELEASE_NS, check=False)
    objs = objects(render(FEEDBACK_VALUES, name=FEEDBACK_RELEASE, namespace=RELEASE_NS))
    docs = [o for o in objs if o["kind"] in RBAC_KINDS and o["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "agent"]  # fmt: skip
    crds.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
    (sa,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    token = request_token(crds, RELEASE_NS, sa)
    path = crds.write_kubeconfig(crds.workdir / "agent-feedback.kubeconfig", token=token)
    return objs, Credentials(sa, token, path)


def default_agent_sa() -> str:
    """The default release's agent ServiceAccount name (as its ClusterRoleBinding's subject)."""
    objs = chart_objects()
    (sa,) = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "ServiceAccount" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    ]
    return str(sa)


def be_pod(name: str, *, checkpoints: bool, workload: str = "training:best-effort") -> dict[str, Any]:
    ann = {contract.ANN_WORKLOAD: workload}
    if checkpoints:
        ann[contract.ANN_CHECKPOINTS] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": ann},
        "spec": {"containers": [{"name": "main", "image": "trainer:1"}]},
    }


async def test_be_feedback_restarts_and_events_use_exactly_their_grants(
    cluster: ControlPlane, feedback_rbac: tuple[list[dict[str, Any]], Credentials], namespace: str
) -> None:
    """The loop's Kubernetes side as the agent's ServiceAccount with agent.lanes.feedback on: the
    restarter re-reads a BE pod and deletes it (UID precondition), refuses one that does not checkpoint
    and a latency-critical one after reading them, and every change or refusal is an Event. The calls it
    makes are exactly what feedback adds to the agent's ClusterRole (the rest is the default agent test's)."""
    from tessera_agent.lanes.book import PodLane
    from tessera_agent.lanes.restarts import KubernetesEventSink, KubernetesPodRestarter, RestartRefused

    objs, creds = feedback_rbac
    lanes = {}
    for name, kw in (
        ("be", {"checkpoints": True}),
        ("no-ckpt", {"checkpoints": False}),
        ("hp", {"checkpoints": True, "workload": "serving:latency-critical"}),
    ):
        status, body = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", be_pod(name, **kw))
        assert status == 201, body
        lanes[name] = PodLane(body["metadata"]["uid"], f"{namespace}/{name}", "GPU-0", "BE", 1024, 30, True)
    api = agent_api(creds)
    restarter = KubernetesPodRestarter(api, min_interval_s=300)
    sink = KubernetesEventSink(api, "node-fb")
    audit = Audit(cluster, sa_user(creds.service_account))
    try:
        await restarter.restart(lanes["be"], "BE share 50% -> 25%")
        await sink.event(lanes["be"].pod, "BEShareChanged", "BE share 50% -> 25%: HP p99 over target")
        refusals = {}
        for name in ("no-ckpt", "hp"):
            with pytest.raises(RestartRefused) as err:
                await restarter.restart(lanes[name], "BE share 50% -> 25%")
            refusals[name] = str(err.value)
            await sink.event(lanes[name].pod, "BERestartRefused", refusals[name], warning=True)
        with pytest.raises(RestartRefused, match="minimum interval"):  # refused before any API call
            await restarter.restart(lanes["be"], "again")
    finally:
        await api.close()

    assert "checkpoints" in refusals["no-ckpt"] and "latency-critical" in refusals["hp"], refusals
    assert restarter.deleted == [lanes["be"].pod]

    def deleted() -> bool:
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/be")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    await wait_for(deleted, 60, "the BE pod to be deleted")
    assert cluster.get(f"/api/v1/namespaces/{namespace}/pods/no-ckpt") is not None
    listed = cluster.get(f"/api/v1/namespaces/{namespace}/events") or {}
    reasons = sorted(
        (e["involvedObject"]["name"], e["reason"])
        for e in listed.get("items", [])
        if e.get("reportingComponent") == "tessera-agent"
    )
    assert reasons == [("be", "BEShareChanged"), ("hp", "BERestartRefused"), ("no-ckpt", "BERestartRefused")]

    events = await wait_for(lambda: audit.events() if len(audit.events()) >= 7 else None, 30, "the audit log")
    assert forbidden(events) == []
    used = {call_of(e) for e in events}
    defaults = grants(chart_objects(), default_agent_sa())
    added = grants(objs, creds.service_account) - defaults
    assert added, "agent.lanes.feedback grants the agent nothing more than the defaults"
    # pods delete and events create come with the lane audit too (on by default): the loop's calls are
    # what feedback adds and what it shares with the audit
    assert_exact(used, added | (used & defaults), "the node agent's BE feedback loop")
    assert used & defaults == {("", "pods", "delete"), ("", "events", "create")}


# --- DRA mode (lanes.api: dra) ----------------------------------------------------------------------------

# A release of its own, so the default release's roles, which the tests above check, stay as they are.
DRA_RELEASE = "tessera-dra"
DRA_VALUES = {"lanes": {"api": "dra"}}
RESOURCE_API = "/apis/resource.k8s.io/v1"
DRA_SCHEDULER = "tessera-dra-scheduler"


@pytest.fixture(scope="module")
def dra_rbac(crds: ControlPlane) -> tuple[list[dict[str, Any]], dict[str, Credentials]]:
    """The chart's RBAC rendered with lanes.api dra (release `tessera-dra`); its objects, and the agent's, the
    operator's and the scheduler's credentials."""
    crds.kubectl("create", "namespace", RELEASE_NS, check=False)
    objs = objects(render(DRA_VALUES, name=DRA_RELEASE, namespace=RELEASE_NS))
    docs = [o for o in objs if o["kind"] in RBAC_KINDS]
    crds.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
    out = {}
    for d in docs:
        component = d["metadata"]["labels"]["app.kubernetes.io/component"]
        if d["kind"] == "ServiceAccount" and component in ("agent", "operator", "scheduler"):
            token = request_token(crds, RELEASE_NS, d["metadata"]["name"])
            path = crds.write_kubeconfig(crds.workdir / f"{component}-dra.kubeconfig", token=token)
            out[component] = Credentials(d["metadata"]["name"], token, path)
    return objs, out


def lane_claim_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "lane", "resourceClaimTemplateName": "lane"}],
            "containers": [{"name": "main", "image": "trainer:1", "resources": {"claims": [{"name": "lane"}]}}],
        },
    }  # fmt: skip


async def test_node_agent_as_dra_driver_uses_exactly_its_dra_grants(
    crds: ControlPlane,
    dra_rbac: tuple[list[dict[str, Any]], dict[str, Credentials]],
    nodes: Nodes,
    namespace: str,
    sock_dir: Path,
) -> None:
    """The DRA driver's whole Kubernetes path as the agent's ServiceAccount of a lanes.api dra release: publish
    the node's inventory and its ResourceSlice (owned by the Node), publish again on a health change, prepare
    a claim that the real kube-scheduler allocated from that slice (the test plays the kubelet), and write the
    progress of the pod the claim is reserved for. Exactly the chart's DRA grants, no more."""
    from tessera_agent.kubelet.dra_plugin import KubernetesDraApi
    from tessera_agent.kubelet.dra_slice import device_class
    from tessera_agent.proto import dra_v1_pb2, dra_v1_pb2_grpc

    cluster = crds
    objs, creds = dra_rbac
    node = nodes.add(f"dra-{secrets.token_hex(3)}", gpus=1)
    backend = FakeGpuBackend([GpuDevice(0, f"GPU-{node}-0", "A100", 40960 * MIB, 512 * MIB, minor=0)])
    proc = FakeProc(sock_dir / "proc")
    cfg = AgentConfig(
        node_name=node,
        lanes_api="dra",
        slots_per_gpu=4,
        mps_root=sock_dir / "mps",
        kubelet_plugins_dir=sock_dir / "plugins",
        kubelet_registry_dir=sock_dir / "reg",
        cdi_dir=sock_dir / "cdi",
        progress_socket=sock_dir / "p.sock",
        proc_root=proc.root,
    )
    api = agent_api(creds["agent"])
    agent = NodeAgent(
        cfg,
        backend,
        KubernetesPodSource(api),
        KubernetesNodePatcher(api),
        AgentMetrics(),
        sample_interval_s=0.5,
        dra=KubernetesDraApi(api),
    )
    slice_path = f"{RESOURCE_API}/resourceslices/{node}-{contract.DRA_DRIVER}"
    status, body = cluster.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    assert status in (201, 409), body
    lane = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "lane"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": contract.DRA_DEVICE_CLASS,
            "capacity": {"requests": {"memory": "4Gi", "computeShare": "25"}}}}]}}},
    }  # fmt: skip
    status, body = cluster.request(
        "POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates", lane
    )
    assert status == 201, body
    audit = Audit(cluster, sa_user(creds["agent"].service_account))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: cluster.get(slice_path), 90, "the agent's ResourceSlice")
        await wait_for(lambda: node_gpus(cluster, node), 90, "the agent's inventory on its Node")
        backend.inject_fault(f"GPU-{node}-0")  # a new pool generation: the slice is updated
        await wait_for(
            lambda: (cluster.get(slice_path) or {}).get("spec", {}).get("pool", {}).get("generation") == 1,
            90,
            "the slice's next generation",
        )
        backend.recover(f"GPU-{node}-0")
        await wait_for(
            lambda: (cluster.get(slice_path) or {}).get("spec", {}).get("pool", {}).get("generation") == 2,
            90,
            "the GPU healthy again in the slice",
        )
        with default_scheduler(cluster):
            status, body = cluster.request(
                "POST", f"/api/v1/namespaces/{namespace}/pods", lane_claim_pod("train", node)
            )
            assert status == 201, body

            def bound() -> Any:
                pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
                return pod if pod and pod["spec"].get("nodeName") else None

            pod = await wait_for(bound, 90, "the pod bound with its claim allocated")
        (claim_status,) = pod["status"]["resourceClaimStatuses"]
        claim = cluster.get(
            f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{claim_status['resourceClaimName']}"
        )
        async with grpc.aio.insecure_channel(f"unix://{cfg.dra_socket}") as channel:
            resp = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
                    namespace=namespace, name=claim["metadata"]["name"], uid=claim["metadata"]["uid"])]),
                timeout=60,
            )  # fmt: skip
        assert not resp.claims[claim["metadata"]["uid"]].error, resp
        # The workload reports progress: no tessera.io/assignment, the claim prepared here vouches for it.
        proc.place(os.getpid(), pod["metadata"]["uid"])
        endpoint = progress_endpoint(str(cfg.progress_socket), namespace, "train")
        await asyncio.to_thread(report_progress, 5, 10, endpoint=endpoint)
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
        assert json.loads(pod["metadata"]["annotations"][contract.ANN_PROGRESS])["iterations"] == 5
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await api.close()
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/train?gracePeriodSeconds=0")
        cluster.request("DELETE", slice_path)
        cluster.request("DELETE", f"{RESOURCE_API}/deviceclasses/{contract.DRA_DEVICE_CLASS}")

    events = audit.events()
    assert forbidden(events) == []
    used = {call_of(e) for e in events}
    assert_exact(used, grants(objs, creds["agent"].service_account), "the node agent as DRA driver")


async def test_operator_in_dra_mode_uses_exactly_its_dra_grants(
    crds: ControlPlane,
    dra_rbac: tuple[list[dict[str, Any]], dict[str, Credentials]],
    nodes: Nodes,
    namespace: str,
) -> None:
    """The operator with --lanes-api dra under the ClusterRole of a lanes.api dra release: the default
    install's calls, plus a ResourceClaimTemplate created before each worker pod (accepted by the real API
    server's validation: CEL selectors, capacity requests) and deleted with it when a new lane size replaces
    a ModelDeployment's workers."""
    cluster = crds
    objs, creds = dra_rbac
    peering = f"rbac-{secrets.token_hex(3)}"
    status, out = cluster.request(
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}},
    )
    assert status == 201, out
    nodes.add(f"opdra-{secrets.token_hex(3)}", gpus=4)
    templates = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
    audit = Audit(cluster, sa_user(creds["operator"].service_account))
    try:
        async with running_operator(
            cluster, creds["operator"], standalone=False, peering_name=peering, priority=1, lanes_api="dra"
        ) as ctl:
            await exercise_operator(cluster, ctl, namespace, replace_workers=True)
    finally:
        cluster.request("DELETE", f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}")

    # the templates left were owned like their pods: the garbage collector removed them with their owners
    await wait_for(lambda: not (cluster.get(templates) or {}).get("items"), 120, "the templates collected")
    events = audit.events()
    assert forbidden(events) == []
    used = {call_of(e) for e in events}
    assert_exact(used, grants(objs, creds["operator"].service_account), "the operator in DRA mode")


def test_extender_reading_claims_uses_exactly_its_dra_grants(
    crds: ControlPlane,
    dra_rbac: tuple[list[dict[str, Any]], dict[str, Credentials]],
    nodes: Nodes,
    namespace: str,
) -> None:
    """`tessera extender --dra-claims` and tessera-scheduler as the scheduler's ServiceAccount of a lanes.api
    dra release: a device-plugin pod bound with its assignment, a pod whose lane claim is made from a template
    bound beside it, a bind for a pod it has not seen and a prioritize naming a claim that does not exist (each
    read from the API server: a 404, not a 403). Nothing refused, and the extender's own ClusterRole holds
    exactly what it calls, resourceclaims included. Its profile has a name of its own: the default release's
    tessera-scheduler of this module's other tests may still be running."""
    from tessera_agent.kubelet.dra_slice import device_class, resource_slice

    cluster = crds
    objs, creds = dra_rbac
    sa = creds["scheduler"].service_account
    audit = Audit(
        cluster, sa_user(sa), since=0
    )  # the extender lists at start; this release's account is its own
    node = nodes.add(f"extdra-{secrets.token_hex(3)}", gpus=2)
    status, body = cluster.request(
        "POST",
        f"{RESOURCE_API}/resourceslices",
        resource_slice(node, FakeGpuBackend.uniform(2), slots=4, generation=0),
    )
    assert status == 201, body
    status, body = cluster.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    assert status in (201, 409), body
    pods = f"/api/v1/namespaces/{namespace}/pods"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "lane"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": contract.DRA_DEVICE_CLASS,
            "capacity": {"requests": {"memory": "4Gi", "computeShare": "25"}}}}]}}},
    }  # fmt: skip
    config = yaml.safe_load((ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text())
    profiles = [{**p, "schedulerName": DRA_SCHEDULER} for p in config["profiles"]]
    lane = lane_claim_pod("lane", node)
    lane["spec"]["schedulerName"] = DRA_SCHEDULER
    plain = fractional_pod("p", "4096", 25)
    plain["spec"]["schedulerName"] = DRA_SCHEDULER
    try:
        args = ("--no-allocate-handoff", "--dra-claims")
        with run_scheduling(cluster, creds["scheduler"], args, {"profiles": profiles}) as scheduling:
            status, out = cluster.request("POST", pods, plain)
            assert status == 201, out
            status, out = cluster.request(
                "POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates", template
            )
            assert status == 201, out
            status, out = cluster.request("POST", pods, lane)
            assert status == 201, out
            for name in ("p", "lane"):
                wait_until(
                    lambda n=name: (cluster.get(f"{pods}/{n}") or {}).get("spec", {}).get("nodeName"),
                    90,
                    f"pod {name} bound through the extender",
                    scheduling.scheduler,
                )
            ghost = {"PodName": "ghost", "PodNamespace": namespace, "PodUID": "u", "Node": node}
            assert post(scheduling.extender_url, "bind", ghost)["Error"] == f"pod {namespace}/ghost not found"
            unseen = {**lane, "metadata": {"name": "unseen", "namespace": namespace, "uid": "u2"}}
            unseen["spec"] = {
                **lane["spec"],
                "resourceClaims": [{"name": "lane", "resourceClaimName": "ghost"}],
            }
            ranked = post(
                scheduling.extender_url, "prioritize", {"Pod": unseen, "Nodes": None, "NodeNames": [node]}
            )
            assert ranked == [{"Host": node, "Score": 0}]  # a claim it cannot read: no priority of its own
    finally:
        cluster.request("DELETE", f"{RESOURCE_API}/resourceslices/{node}-{contract.DRA_DRIVER}")

    assert forbidden(audit.events()) == []  # kube-scheduler's requests included
    extender = audit.events(exclude_agent="kube-scheduler/")
    assert_exact({call_of(e) for e in extender}, grants(objs, sa), "the extender with --dra-claims")


def post(url: str, verb: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{url}/{verb}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())
