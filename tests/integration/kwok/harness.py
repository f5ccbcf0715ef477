"""Thousands of GPU nodes on the real control plane, their kubelets and node agents played by kwok.

kwok (Kubernetes WithOut Kubelet, sigs.k8s.io/kwok; built by `hack/kwok-assets.sh`) watches the Node objects
annotated `kwok.x-k8s.io/node: fake` and the pods bound to them, and plays the stages in stages.yaml: a node
becomes Ready with the capacity it was created with; a pod the extender assigned GPUs is marked allocated as
the node agent's Allocate marks it (so the extender's one-pod-at-a-time handoff runs as on a real node), then
runs, then succeeds after the duration its `tessera.io/kwok-duration` annotation gives. Everything else is
real: API server, kube-scheduler, extender, operator.

Importable outside pytest (benchmarks): nothing here needs a fixture.

    with control_plane() as cluster, kwok_nodes(cluster, trace_nodes(5000)) as names:
        ...
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import ssl
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from tessera.api import contract
from tessera.api.gpu_inventory import GpuInfo, dump_node_gpus
from tessera.extender.view import ANN_GPU_MODELS
from tessera.policy.lanes.fragmentation import Shape
from tessera.sim.packing.trace import NodeSpec, read_nodes
from tessera_agent.reserve import reserve_taint

from tests.integration.k8s.controlplane import (
    ADMIN_TOKEN,
    ROOT,
    ControlPlane,
    Process,
    control_plane,
    go_assets,
    wait_until,
)
from tests.ports import free_port

STAGES = Path(__file__).with_name("stages.yaml")
TRACE = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
NODE_LIST = TRACE / "openb_node_list_gpu_node.csv"
POD_LIST = TRACE / "openb_pod_list_default.csv"
# kwok manages the nodes carrying this annotation; the same pair as a label lets the harness list them.
KWOK_KEY, KWOK_VALUE = "kwok.x-k8s.io/node", "fake"
# A pod's run time in seconds: it succeeds that long after its start (tessera-pod-complete in stages.yaml).
ANN_DURATION = f"{contract.GROUP}/kwok-duration-seconds"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
PODS_PER_NODE = 110  # the kubelet's default maxPods


# kwok's informers watch from resourceVersion "0" every time. An API server with the WatchList feature (on by
# default since 1.34) serves such a watch as a watch-list stream, which needs etcd's RequestWatchProgress:
# the test etcd (Debian's 3.4.23) lacks it, so each of kwok's watches ended at once with an error and kwok
# saw a change only at its next re-list, seconds later (a 3 s pod ran 13 s). kwok's control plane runs
# with the feature off; kube-scheduler's and the controllers' informers list first and never ask for it.
KWOK_APISERVER_ARGS = ("--feature-gates=WatchList=false",)


@contextlib.contextmanager
def kwok_control_plane(controller_manager_args: tuple[str, ...] = ()) -> Iterator[ControlPlane]:
    """The real-cluster tests' control plane (controlplane.control_plane) as kwok needs it: see above."""
    with control_plane(
        apiserver_args=KWOK_APISERVER_ARGS, controller_manager_args=controller_manager_args
    ) as plane:
        yield plane


def kwok_binary() -> Path:
    """kwok: `$TESSERA_KWOK_DIR/kwok` (hack/test.sh exports it), else what `hack/kwok-assets.sh` builds (from
    its cache once built). NoBinaries where there is no Go to build it, as for the Kubernetes components."""
    return go_assets("TESSERA_KWOK_DIR", "kwok-assets.sh", "kwok", ("kwok",)) / "kwok"


def _healthy(url: str) -> bool:
    conn = http.client.HTTPConnection(url, timeout=2)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    finally:
        conn.close()


def start_kwok(
    cluster: ControlPlane,
    *,
    stages: Path = STAGES,
    cidr: str = "10.128.0.0/10",
    node_ip: str = "10.127.0.1",
    parallelism: int = 8,
    node_lease_seconds: int = 0,
) -> Process:
    """kwok against the cluster's API server as cluster-admin, managing only nodes annotated
    `kwok.x-k8s.io/node: fake` and playing `stages` (kwok's Stage API; none of kwok's defaults).

    Pod IPs come from `cidr` (every fake node shares `node_ip`). `parallelism` is how many node and pod stages
    kwok plays at once. `node_lease_seconds` > 0 has kwok hold a Lease per node (what the node lifecycle
    controller reads); 0, the default, holds none: the test control plane runs no node lifecycle controller,
    and 5,000 leases renewed every few seconds would cost more than the scheduling being measured. Stopped
    with the cluster, or by `.stop()`."""
    port = free_port()
    # Parallelism is no flag: it goes in a KwokConfiguration, in the same file as the stages.
    options = {"podPlayStageParallelism": parallelism, "nodePlayStageParallelism": parallelism}
    config = cluster.workdir / f"kwok-{port}.yaml"
    config.write_text(
        yaml.safe_dump(
            {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": options}
        )
        + "---\n"
        + stages.read_text()
    )
    proc = cluster.spawn(
        f"kwok-{port}",
        [str(kwok_binary()), f"--kubeconfig={cluster.kubeconfig}",
         "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_KEY}={KWOK_VALUE}",
         f"--config={config}", f"--cidr={cidr}", f"--node-ip={node_ip}",
         f"--server-address=127.0.0.1:{port}",
         f"--node-lease-duration-seconds={node_lease_seconds}"],
    )  # fmt: skip
    wait_until(lambda: _healthy(f"127.0.0.1:{port}"), 60, "kwok's /healthz", proc)
    return proc


def gpu_memory_mib(node: NodeSpec) -> int:
    """GPU memory per model, from the packing simulator's table (tessera.sim.packing.trace.GPU_MEMORY_MIB)."""
    return node.gpu_memory_mib


def node_body(node: NodeSpec, *, reserve: bool = True, slots_per_gpu: int = 1) -> dict[str, Any]:
    """A Node as the kubelet registers it and the node agent annotates it: capacity (CPU, memory, pods, the
    agent's `tessera.io/gpu` slots), the agent's GPU inventory annotation, and with `reserve` the taint the
    agent puts on a reserved GPU node; annotated (and labelled) for kwok."""
    inv = [
        GpuInfo(uuid=f"GPU-{node.name}-{i}", index=i, model=node.model, memory_mib=gpu_memory_mib(node))
        for i in range(node.gpus)
    ]
    capacity = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(PODS_PER_NODE),
        contract.RESOURCE_GPU: str(node.gpus * slots_per_gpu),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {"kubernetes.io/hostname": node.name, KWOK_KEY: KWOK_VALUE},
            "annotations": {KWOK_KEY: KWOK_VALUE, contract.ANN_NODE_GPUS: dump_node_gpus(inv)},
        },
        "spec": {"taints": [reserve_taint()] if reserve else []},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def trace_specs(count: int, path: Path = NODE_LIST) -> list[NodeSpec]:
    """`count` nodes of Alibaba's node list in its order, tiled (names suffixed -1, -2, …) past its end."""
    base = read_nodes(path)
    out = []
    for i in range(count):
        n = base[i % len(base)]
        rep = i // len(base)
        out.append(n if rep == 0 else NodeSpec(f"{n.name}-{rep}", n.cpu_milli, n.memory_mib, n.gpus, n.model))
    return out


def trace_nodes(count: int, *, reserve: bool = True, slots_per_gpu: int = 1) -> list[dict[str, Any]]:
    """Node objects for `count` of Alibaba's GPU nodes (trace_specs, node_body)."""
    return [node_body(n, reserve=reserve, slots_per_gpu=slots_per_gpu) for n in trace_specs(count)]


class _Client:
    """Keep-alive HTTPS connections to the API server, one per thread, as cluster-admin."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.host = cluster.bind_address
        self.port = cluster.api_port
        self.token = ADMIN_TOKEN
        self.ssl = ssl.create_default_context(cafile=str(cluster.ca_file))
        self.local = threading.local()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        for attempt in range(3):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.ssl, timeout=60
                )
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            try:
                conn.request(method, path, None if body is None else json.dumps(body), headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
                continue
            try:
                return resp.status, json.loads(raw)
            except json.JSONDecodeError:
                return resp.status, raw.decode(errors="replace")
        raise AssertionError("unreachable")


def _say(message: str) -> None:
    print(f"[kwok harness] {message}", file=sys.stderr, flush=True)


def kwok_ready(node: dict[str, Any]) -> bool:
    """kwok has initialized the node: Ready, and the admission's not-ready taint lifted."""
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)


def list_kwok_nodes(cluster: ControlPlane) -> list[dict[str, Any]]:
    # resourceVersion=0: from the API server's watch cache, not a read of etcd (a list of 5,000 is ~15 MB)
    path = f"/api/v1/nodes?labelSelector={KWOK_KEY}%3D{KWOK_VALUE}&resourceVersion=0"
    status, body = cluster.request("GET", path)
    assert status == 200, body
    return list(body.get("items") or [])


def create_nodes(
    cluster: ControlPlane,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int = 16,
    ready_timeout: float | None = None,
) -> list[str]:
    """Create the Node objects `concurrency` at a time and wait until kwok has made every one Ready; their
    names. Progress on stderr past 500 nodes. `ready_timeout` defaults to 60 s plus 60 ms a node."""
    client = _Client(cluster)
    names = [b["metadata"]["name"] for b in bodies]
    loud = len(bodies) >= 500
    done = 0
    lock = threading.Lock()
    t0 = time.monotonic()

    def create(body: dict[str, Any]) -> None:
        nonlocal done
        status, out = client.request("POST", "/api/v1/nodes", body)
        if status != 201:
            raise AssertionError(f"creating node {body['metadata']['name']}: {status} {str(out)[:500]}")
        with lock:
            done += 1
            if loud and done % 500 == 0:
                _say(f"{done}/{len(bodies)} nodes created ({time.monotonic() - t0:.0f} s)")

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(create, bodies))
    if loud:
        _say(
            f"{len(bodies)} nodes created in {time.monotonic() - t0:.1f} s; waiting for kwok to make them Ready"
        )
    wanted = set(names)
    last = -1

    def all_ready() -> bool:
        nonlocal last
        ready = sum(1 for n in list_kwok_nodes(cluster) if n["metadata"]["name"] in wanted and kwok_ready(n))
        if loud and ready != last:
            _say(f"{ready}/{len(wanted)} nodes Ready ({time.monotonic() - t0:.0f} s)")
            last = ready
        if ready < len(wanted):
            time.sleep(min(5.0, 0.5 + len(wanted) / 2000))  # a full list of 5,000 nodes is ~15 MB
        return ready == len(wanted)

    timeout = ready_timeout if ready_timeout is not None else 60 + 0.06 * len(bodies)
    wait_until(all_ready, timeout, f"kwok to make {len(wanted)} nodes Ready")
    return names


def delete_kwok_nodes(cluster: ControlPlane, timeout: float = 300) -> None:
    """Delete every kwok node (one collection delete) and wait until they are gone."""
    status, body = cluster.request("DELETE", f"/api/v1/nodes?labelSelector={KWOK_KEY}%3D{KWOK_VALUE}")
    assert status == 200, str(body)[:500]
    wait_until(lambda: not list_kwok_nodes(cluster), timeout, "the kwok nodes to be deleted")


@contextlib.contextmanager
def kwok_nodes(
    cluster: ControlPlane, bodies: Sequence[dict[str, Any]], **kwok_options: Any
) -> Iterator[list[str]]:
    """kwok started and `bodies` created and Ready; on exit the nodes deleted and kwok stopped."""
    kwok = start_kwok(cluster, **kwok_options)
    try:
        yield create_nodes(cluster, bodies)
    finally:
        with contextlib.suppress(Exception):
            delete_kwok_nodes(cluster)
        kwok.stop()


def trace_pod(
    name: str,
    shape: Shape,
    *,
    gpu_memory_mib: int,
    duration_s: float | None = None,
    scheduler: str | None = contract.SCHEDULER_NAME,
) -> dict[str, Any]:
    """A pod of the trace's shape: CPU and memory requests, `tessera.io/gpu` for its GPUs; a fraction of a
    GPU (gpu_milli < 1000) asks that share of `gpu_memory_mib` and of the GPU's compute, a whole GPU asks
    the whole GPU (no memory given). `duration_s` None: it runs until deleted. `scheduler` None leaves
    spec.schedulerName to the namespace's routing (the chart's gpuNodes policy)."""
    requests = {"cpu": f"{int(shape.cpu_milli)}m", "memory": f"{int(shape.memory_mib)}Mi"}
    limits: dict[str, str] = {}
    if shape.gpus:
        limits[contract.RESOURCE_GPU] = str(shape.gpus)
        if shape.compute < 1:
            limits[contract.RESOURCE_GPU_MEMORY] = str(max(1, round(shape.compute * gpu_memory_mib)))
            limits[contract.RESOURCE_GPU_COMPUTE] = str(max(1, round(shape.compute * 100)))
    annotations = {ANN_GPU_MODELS: "|".join(sorted(shape.models))} if shape.models else {}
    if duration_s is not None:
        annotations[ANN_DURATION] = str(max(0, math.ceil(duration_s)))
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "x", "resources": {"requests": requests, "limits": limits}}],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
        spec["tolerations"] = [contract.gpu_node_toleration()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


def create_pods(
    cluster: ControlPlane, namespace: str, bodies: Iterable[dict[str, Any]], *, concurrency: int = 8
) -> list[dict[str, Any]]:
    """Create pods `concurrency` at a time; the created objects, in order."""
    client = _Client(cluster)

    def create(body: dict[str, Any]) -> dict[str, Any]:
        status, out = client.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        if status != 201:
            raise AssertionError(f"creating pod {body['metadata']['name']}: {status} {str(out)[:500]}")
        return dict(out)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(create, bodies))
