"""The chart installed with Helm on the real node, its images built from this repository, and used as a user
uses it: every pod started by the kubelet, the node's GPU capacity published by the kubelet from the agent's
device plugin, and an App whose job runs in the Tessera image and reports progress through the agent's socket.

It is installed with gpuNodes.reserve: the agent taints its node, and the tests' namespaces are labelled for
the chart's MutatingAdmissionPolicy, so their plain pods (and every pod the operator makes) reach the node
through tessera-scheduler with the toleration; the chart's operator and scheduler get the toleration from
their values, as docs/operations.md tells an admin whose only nodes are GPU nodes.

The agent runs its fake GPU backend (`agent.fakeGpus`, behind the NVML interface); everything else is what a
cluster with GPUs runs. Its hostPath directories are the node's own (under the harness's work dir), so
nothing is written to the host's /run or /var/lib/kubelet.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np
import pytest
import yaml
from tessera.api import contract
from tessera.gateway.demo_models import early_exit_reference

from tests.integration.k8s.admin_cli import AdminCLI
from tests.integration.k8s.controlplane import wait_until
from tests.integration.k8s.test_chart_install import CHART, api_path, key
from tests.unit.chart.chart_render import objects, render

from . import adversary
from .dns import query as dns_query
from .node import Node
from .together import bind_together, lane_pod

NS = "tessera-system"
RELEASE = "tessera"
FAKE_GPUS = 2
SLOTS_PER_GPU = 4
SOCKET_GROUP = 7070
LEASE_S = 20
CHECKPOINT_GRACE_S = 20


def pods(node: Node, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    query = f"?labelSelector={selector}" if selector else ""
    status, body = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods{query}")
    assert status == 200, body
    return list(body["items"])


def ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod["status"].get("phase") == "Running" and conditions.get("Ready") == "True"


def pod_log(node: Node, namespace: str, name: str, container: str = "") -> str:
    query = f"?container={container}" if container else ""
    status, body = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log{query}")
    return body if status == 200 and isinstance(body, str) else ""


def workload_template(
    node: Node,
    container: str,
    command: list[str],
    *,
    host_dir: tuple[str, Any] | None = None,
    socket_group: bool = False,
) -> dict[str, Any]:
    """The pod template of a workload run from the project's image: one container running `command`, never
    restarted; `host_dir` (name, path) is a host directory mounted at /<name>; `socket_group` adds the
    agent sockets' group, as a user's pod that reports progress needs."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": container,
                "image": node.images["TESSERA_IMAGE"],
                "imagePullPolicy": "Never",
                "command": command,
            }
        ],
    }
    if socket_group:
        spec["securityContext"] = {"supplementalGroups": [SOCKET_GROUP]}
    if host_dir is not None:
        name, path = host_dir
        spec["containers"][0]["volumeMounts"] = [{"name": name, "mountPath": f"/{name}"}]
        spec["volumes"] = [{"name": name, "hostPath": {"path": str(path), "type": "Directory"}}]
    return {"spec": spec}


def chart_values(node: Node) -> dict[str, Any]:
    repository, tag = node.images["TESSERA_IMAGE"].rsplit(":", 1)
    host = node.host_dir
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        # Short leases so a second App wins a GPU within the test; every App bids in each round (f = 0), so
        # the round at the first App's lease expiry splits the GPUs between the two.
        "operator": {
            "themis": {
                "leaseSeconds": LEASE_S,
                "preemptionGraceSeconds": CHECKPOINT_GRACE_S,
                "fairnessKnob": 0,
            },
            "tolerations": [contract.gpu_node_toleration()],
        },
        # registry.k8s.io/kube-scheduler:<the cluster's version>, built by hack/images.sh from the same binary.
        "scheduler": {
            "kubeScheduler": {"image": {"pullPolicy": "Never"}},
            "tolerations": [contract.gpu_node_toleration()],
        },
        # The one node is a GPU node, kept for tessera-scheduler's pods.
        "gpuNodes": {"reserve": True},
        "agent": {
            "fakeGpus": FAKE_GPUS,
            "fakeDevRoot": str(host / "fake-dev"),  # the fake GPUs' device nodes, which containers are given
            "slotsPerGpu": SLOTS_PER_GPU,
            # The kubelet's registration socket is at the chart's default path whatever its --root-dir.
            "devicePluginDir": str(node.device_plugin_dir),
            # Its PodResources socket is under its --root-dir (the lane audit reads it).
            "kubeletRootDir": str(node.kubelet_root),
            "mpsRoot": str(host / "mps"),
            "progress": {"enabled": True, "hostDir": str(host / "progress")},
            "coordinator": {"hostDir": str(host / "coordinator")},
            "sockets": {"groupId": SOCKET_GROUP},
        },
    }


def describe(node: Node, namespace: str) -> str:
    """What the pods of a namespace are doing (for a failed wait): phase, conditions, container states."""
    lines = []
    for pod in pods(node, namespace):
        st = pod.get("status", {})
        states = {c["name"]: c.get("state") for c in st.get("containerStatuses", [])}
        lines.append(f"{pod['metadata']['name']}: {st.get('phase')} {json.dumps(states)[:600]}")
        unscheduled = [
            f"{c.get('reason')}: {c.get('message')}"
            for c in st.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ]
        if unscheduled:
            lines.append(f"  not scheduled: {unscheduled[0][:600]}")
        for cs in st.get("containerStatuses", []):
            if cs.get("restartCount"):
                query = f"?container={cs['name']}&previous=true&tailLines=5"
                _, log = node.plane.request(
                    "GET", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log{query}"
                )
                lines.append(f"  {cs['name']} before its last restart: {log}")
    return "\n".join(lines)


def route_to_tessera(node: Node, namespace: str) -> str:
    """Label a namespace so that the chart's admission policy routes its pods to tessera-scheduler, with the
    toleration of the taint gpuNodes.reserve has the agent put on its node."""
    labels = {"metadata": {"labels": {contract.LABEL_GPU_NODES_NAMESPACE: "true"}}}
    status, got = node.plane.request(
        "PATCH", f"/api/v1/namespaces/{namespace}", labels, content_type="application/merge-patch+json"
    )
    assert status == 200, got
    return namespace


@pytest.fixture
def namespace(namespace: str, node: Node) -> str:
    """The conftest's fresh namespace, labelled so that the chart routes its pods to tessera-scheduler."""
    return route_to_tessera(node, namespace)


def helm_install(
    node: Node, cli: AdminCLI, release: str, values: dict[str, Any], namespace: str = NS
) -> None:
    """`helm install <release> charts/tessera -n <namespace> --create-namespace -f <values>`, as an admin
    runs it with the Helm 4 CLI."""
    path = node.plane.workdir / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = cli.helm(
        "install", release, CHART, "-n", namespace, "--create-namespace", "-f", str(path), "--timeout", "300s"
    )
    assert "STATUS: deployed" in out.stdout, out.stdout


def released(cli: AdminCLI) -> list[str]:
    """The releases of tessera-system in any state (`helm list -q`: every status, in Helm 4)."""
    return cli.helm("list", "-n", NS, "-q").stdout.split()


@pytest.fixture(scope="module")
def release(node: Node, admin_cli: AdminCLI) -> Iterator[AdminCLI]:
    """The chart installed into tessera-system with the local images; every pod Running and Ready."""
    t0 = time.monotonic()
    helm_install(node, admin_cli, RELEASE, chart_values(node))
    try:
        wait_until(
            lambda: len(got := pods(node, NS)) == 4 and all(ready(p) for p in got),
            300,
            "the chart's 4 pods (2 operators, scheduler, agent) to be Running and Ready",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{describe(node, NS)}") from err
    node.timings["chart ready"] = time.monotonic() - t0
    yield admin_cli
    if released(admin_cli):  # test_helm_uninstall_… did not run or failed before uninstalling
        admin_cli.helm("uninstall", RELEASE, "-n", NS, "--timeout", "300s", check=False)


def test_every_chart_pod_runs_and_the_operators_elect_one_leader(node: Node, release: AdminCLI) -> None:
    got = pods(node, NS)
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in got)
    assert components == ["agent", "operator", "operator", "scheduler"]
    for pod in got:
        assert pod["spec"]["nodeName"] == node.name
        for cs in pod["status"]["containerStatuses"]:
            assert cs["ready"] and cs["restartCount"] == 0, (pod["metadata"]["name"], cs)
    # The image runs as its unprivileged user; only the agent asks for root.
    operator = next(p for p in got if p["metadata"]["labels"]["app.kubernetes.io/component"] == "operator")
    assert operator["spec"]["securityContext"]["runAsUser"] == 10001

    # kopf peering: both replicas keep a record alive with a priority each drew at start; the highest is
    # active and the other pauses.
    leader, standby = wait_until(lambda: operator_roles(node), 120, "both operator replicas in the peering")
    wait_until(
        lambda: peering_state(pod_log(node, NS, leader)) == "active", 120, f"the leader {leader} to resume"
    )
    assert peering_state(pod_log(node, NS, standby)) == "paused"
    assert leader != standby


def peering_state(log: str) -> str:
    """A replica's state by its log: kopf starts it paused (the peering is mandatory), logs "Resuming
    operations" when no higher-priority peer is alive and "Pausing operations" when one appears after that,
    so a standby that started after the leader never logs either."""
    resumed, paused = log.rfind("Resuming operations"), log.rfind("Pausing operations")
    return "active" if resumed > paused else "paused"


def operator_roles(node: Node) -> tuple[str, str] | None:
    """(leader, standby) operator pod names by their ClusterKopfPeering priorities; None until both are there.

    kopf names a peer `<user>@<hostname>/<start>/<random>`, the hostname being the pod's name."""
    obj = node.plane.get("/apis/kopf.dev/v1/clusterkopfpeerings/tessera") or {}
    peers = dict(obj.get("status") or {})
    names = [p["metadata"]["name"] for p in component_pods(node, "operator")]
    priority = {n: info["priority"] for ident, info in peers.items() for n in names if f"@{n}/" in ident}
    if len(priority) != 2 or len(set(priority.values())) != 2:
        return None
    ranked = sorted(priority, key=priority.__getitem__)
    return ranked[1], ranked[0]


def test_the_kubelet_publishes_gpu_capacity_from_the_device_plugin(node: Node, release: AdminCLI) -> None:
    # The kubelet publishes the resource at "0" while it holds no live device list for it (an endpoint it
    # read from its checkpoint, or one past its stop grace), so "0" is a state on the way, not an answer:
    # wait for the plugin's count and keep every value seen, for the failure message.
    expected = str(FAKE_GPUS * SLOTS_PER_GPU)
    seen: list[tuple[float, str | None, str | None]] = []
    t0 = time.monotonic()

    def capacity() -> bool:
        st = (node.node() or {}).get("status", {})
        got = (
            st.get("capacity", {}).get(contract.RESOURCE_GPU),
            st.get("allocatable", {}).get(contract.RESOURCE_GPU),
        )
        if not seen or seen[-1][1:] != got:
            seen.append((round(time.monotonic() - t0, 1), *got))
        return got == (expected, expected)

    try:
        wait_until(capacity, 180, f"{contract.RESOURCE_GPU} {expected}/{expected} on the node")
    except TimeoutError as err:
        kubelet = node.processes["kubelet"].log.read_text(errors="replace").splitlines()
        plugin_lines = [line for line in kubelet if "device plugin" in line.lower() or "ListAndWatch" in line]
        raise AssertionError(
            f"{err}\n(s, capacity, allocatable) seen: {seen}\nkubelet:\n"
            + "\n".join(plugin_lines[-30:])
            + f"\n{describe(node, NS)}"
        ) from err
    node.timings["device plugin: capacity published after the chart was ready"] = seen[-1][0]
    # The agent published its inventory on the Node too (its own API write, with its ServiceAccount).
    annotations = (node.node() or {})["metadata"].get("annotations", {})
    assert contract.ANN_NODE_GPUS in annotations
    # The kubelet's registration socket and the plugin's are where the kubelet (not a test) put and found them.
    assert (node.device_plugin_dir / "kubelet.sock").exists()
    assert (node.device_plugin_dir / contract.AGENT_SOCKET_NAME).exists()


def reserve_taints(node: Node) -> list[dict[str, Any]]:
    taints = ((node.node() or {}).get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("key") == contract.TAINT_GPU_NODE_KEY]


def test_the_agent_reserves_its_node_and_only_routed_pods_land_there(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    want = {
        "key": contract.TAINT_GPU_NODE_KEY,
        "value": contract.TAINT_GPU_NODE_VALUE,
        "effect": contract.TAINT_GPU_NODE_EFFECT,
    }
    assert wait_until(lambda: reserve_taints(node), 120, "the agent's taint on its node") == [want]
    # A labelled namespace's plain pod: routed by the chart's policy, placed through the extender, running.
    sleeper(node, namespace)
    (pod,) = pods(node, namespace)
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert contract.gpu_node_toleration() in pod["spec"]["tolerations"]
    # Elsewhere a pod is default-scheduler's and stays off the reserved node.
    other = f"plain-{pod['metadata']['uid'][:8]}"
    status, got = node.plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": other}})
    assert status == 201, got
    try:
        wait_until(
            lambda: (
                node.plane.request("GET", f"/api/v1/namespaces/{other}/serviceaccounts/default")[0] == 200
            ),
            60,
            f"the default ServiceAccount of {other}",
        )
        sleeper(node, other, wait=False)

        def refused() -> str:
            conditions = (node.plane.get(f"/api/v1/namespaces/{other}/pods/sleeper") or {}).get("status", {})
            return next(
                (
                    c.get("message", "")
                    for c in conditions.get("conditions") or []
                    if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                ),
                "",
            )

        # The node's one taint is the agent's (kube-scheduler's message names no key).
        assert ((node.node() or {}).get("spec") or {}).get("taints") == [want]
        assert "untolerated taint" in wait_until(refused, 120, "default-scheduler to refuse the pod")
    finally:
        node.plane.request("DELETE", f"/api/v1/namespaces/{other}")


TRAIN = """
import os, re, sys, time
from tessera import sdk
total = int(sys.argv[1])
print("ENV", {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "TESSERA_", "NVIDIA_"))}, flush=True)
# Reports stop one short of the target: the job ends by its pod exiting 0 (the kubelet's Succeeded), not by a
# report (which would let the operator release the lease and delete the pod while it still runs).
for i in range(1, total):
    time.sleep(0.5)  # one training step
    print("progress", i, sdk.report_progress(i, total), flush=True)
# The same socket, naming another pod: the agent maps this process to its own pod and refuses.
endpoint = os.environ["TESSERA_PROGRESS_ENDPOINT"]
other = re.sub(r"/pods/[^/]+/progress$", "/pods/someone-else/progress", endpoint)
try:
    sdk.report_progress(1, total, endpoint=other)
    print("FORGED REPORT ACCEPTED", flush=True)
except sdk.ProgressError as err:
    print("REFUSED", err, flush=True)
"""


def test_an_app_job_reports_progress_from_its_container_and_completes(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    iters = 6
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": "train"},
        "spec": {
            "template": workload_template(
                node, "train", ["python", "-c", TRAIN, str(iters)], socket_group=True
            ),
            "jobs": [{"name": "j", "iterTotal": iters, "iterTimeSerialSeconds": 0.5, "maxGPUs": 1}],
        },
    }
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL_APP}"
    status, got = node.plane.request("POST", path, body)
    assert status == 201, got

    def app() -> dict[str, Any]:
        return dict((node.plane.get(f"{path}/train") or {}).get("status") or {})

    def finished_pod() -> tuple[dict[str, Any], str] | None:
        """The job's pod and its log once the workload printed its last line (read while the pod exists)."""
        for pod in pods(node, namespace, f"{contract.LABEL_APP}=train"):
            log = pod_log(node, namespace, pod["metadata"]["name"])
            if "REFUSED" in log or "FORGED" in log:
                return pod, log
        return None

    try:
        pod, log = wait_until(finished_pod, 300, "the job's container to finish its loop")
        seen: dict[str, str] = {}

        def succeeded() -> bool:
            got = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}")
            seen["pod"] = got["status"].get("phase", "") if isinstance(got, dict) else "deleted"
            return app().get("phase") == "Succeeded"

        wait_until(succeeded, 300, "the App to succeed")
    except TimeoutError as err:
        raise AssertionError(f"{err}\nApp status: {app()}\n{describe(node, namespace)}") from err
    # The kubelet's report, the container having exited 0 (or the operator removed the finished job's pod).
    assert seen["pod"] in ("Succeeded", "deleted"), seen
    assert pod["spec"]["nodeName"] == node.name
    # Allocate's env, as the container saw it: the fake GPU the extender assigned and the agent's socket.
    env_line = next(line for line in log.splitlines() if line.startswith("ENV "))
    assert "GPU-00000000-0000-0000-0000-00000000000" in env_line, env_line
    assert contract.ENV_PROGRESS_ENDPOINT in env_line, env_line
    # Each report went through the socket, passed the peer check (SO_PEERCRED → the container's real cgroup
    # path → this pod) and was written on the pod by the agent.
    assert f"progress {iters - 1} " in log, log
    got = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}")
    if isinstance(got, dict):
        assert json.loads(got["metadata"]["annotations"][contract.ANN_PROGRESS])["iterations"] == iters - 1
    refused = next(line for line in log.splitlines() if line.startswith(("REFUSED", "FORGED")))
    assert (
        refused.startswith("REFUSED") and f"belongs to pod {namespace}/{pod['metadata']['name']}" in refused
    )
    final = app()
    assert final["rho"] >= 0, final


TRIAL = """
import json, os, sys, time
from pathlib import Path
from tessera import sdk
name, total = os.environ["TESSERA_TRIAL"], int(sys.argv[1])
lane = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "TESSERA_LANE"))}
print("LANE", json.dumps(lane), flush=True)
# All three trials must run at the same time: each marks itself and waits for the others.
barrier = Path("/barrier")
(barrier / name).touch()
deadline = time.monotonic() + 240
while len(list(barrier.iterdir())) < 3:
    if time.monotonic() > deadline:
        sys.exit("the other trials never started")
    time.sleep(0.2)
print("TOGETHER", sorted(p.name for p in barrier.iterdir()), flush=True)
for i in range(1, total + 1):
    time.sleep(0.5)
    sdk.report_progress(i, total, loss=1.0 / i)
print("DONE", flush=True)
"""


def test_a_trialgroup_runs_three_trials_at_once_on_lanes_of_one_gpu(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    barrier = node.host_dir / f"barrier-{namespace}"
    barrier.mkdir(mode=0o777)
    barrier.chmod(0o777)
    budget = 6
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": "tg"},
        "spec": {
            "template": workload_template(
                node,
                "trial",
                ["python", "-c", TRIAL, str(budget)],
                host_dir=("barrier", barrier),
                socket_group=True,
            ),
            "gpus": 1,
            "fluid": {"maxPackPerGPU": 3},
            "trials": [
                {"name": n, "budgetIterations": budget, "iterTimeSeconds": 0.5, "config": {}} for n in "abc"
            ],
        },
    }
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL_TRIALGROUP}"
    status, got = node.plane.request("POST", path, body)
    assert status == 201, got

    def tg() -> dict[str, Any]:
        return dict((node.plane.get(f"{path}/tg") or {}).get("status") or {})

    try:
        wait_until(lambda: tg().get("trialsDone") == 3, 300, "the three trials to be done")
    except TimeoutError as err:
        raise AssertionError(f"{err}\nstatus: {tg()}\n{describe(node, namespace)}") from err
    # A trial's last report can reach the operator before its container has exited: wait for the kubelet.
    trial_pods = wait_until(
        lambda: (
            len(got := pods(node, namespace, f"{contract.LABEL_TRIALGROUP}=tg")) == 3
            and all(p["status"].get("phase") == "Succeeded" for p in got)
            and got
        ),
        120,
        f"the three trial pods Succeeded\n{describe(node, namespace)}",
    )
    lanes = {}
    for pod in trial_pods:
        log = pod_log(node, namespace, pod["metadata"]["name"])
        assert "TOGETHER ['a', 'b', 'c']" in log and "DONE" in log, log
        lane = json.loads(next(line for line in log.splitlines() if line.startswith("LANE "))[5:])
        lanes[pod["metadata"]["labels"][contract.LABEL_TRIAL]] = lane
        assert pod["status"]["phase"] == "Succeeded"
    # One physical GPU, three lanes: each container saw its own lane id and its share of the GPU.
    assert len({lane[contract.ENV_CUDA_VISIBLE_DEVICES] for lane in lanes.values()}) == 1, lanes
    assert len({lane[contract.ENV_LANE_ID] for lane in lanes.values()}) == 3, lanes
    for lane in lanes.values():
        assert lane[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "33", lane
    # A third of the GPU's memory each, as the device ordinal the container sees (0).
    limits = {lane[contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] for lane in lanes.values()}
    assert len(limits) == 1 and re.fullmatch(r"0=\d+M", limits.pop()), lanes
    st = tg()
    assert {t["name"]: t["phase"] for t in st["trials"]} == dict.fromkeys("abc", "Completed"), st


def test_pods_bound_together_each_run_on_their_own_gpu_and_lane(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    """Issue 44: pods with equal requests bound to the node at once used to swap GPUs and lanes (the kubelet's
    Allocate does not say which pod it serves). With the extender's handoff and the agent's refusal to guess,
    every container runs with its own pod's assignment, round after round (tests/bench/bench_node_handoff.py
    runs 20 and more, with and without the handoff)."""
    rounds = [bind_together(node, namespace, 4, f"r{r}") for r in range(3)]
    for r in rounds:
        assert r.mismatches == [] and r.refused == [], r
    rates = ", ".join(f"{r.binds_per_second:.2f}" for r in rounds)
    print(f"\n[handoff] 3 rounds of 4 pods: 0 mismatches, 0 refused; binds/s per round: {rates}")
    assert not [e for e in events(node, namespace) if e["reason"] == "LaneMismatch"]


def test_a_tenant_cannot_reach_another_lanes_socket_pipe_shm_or_gpu(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    """Issue 39, device-plugin mode: from inside its container a tenant finds no other lane's MPS socket,
    writes only into its own lane's pipe directory, cannot read its neighbour's /dev/shm, raises its limits in
    its env while its daemon keeps holding the lane's, and has exactly its GPU's device node: another GPU's,
    made with mknod, cannot be opened (tests/integration/node/adversary.py). The chart's agent runs each
    lane's daemon with the fake MPS control binary (legacy interface)."""
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: "1024",
        contract.RESOURCE_GPU_COMPUTE: "10",
    }
    lane = {"container": {"resources": {"limits": limits}}}
    wait_until(lambda: gpu_slots(node) >= 2, 120, "the node to publish its tessera.io/gpu slots")
    create(node, namespace, adversary.pod(node, "neighbour", adversary.NEIGHBOUR, dict(lane)))
    wait_until(
        lambda: "READY" in pod_log(node, namespace, "neighbour"), 180, "the neighbour to hold its lane"
    )
    create(node, namespace, adversary.pod(node, "prober", adversary.prober_script(FAKE_GPUS), dict(lane)))
    seen = wait_until(
        lambda: adversary.probe_result(pod_log(node, namespace, "prober")), 180, "the prober's report"
    )
    prober = get_pod(node, namespace, "prober")
    own = json.loads(prober["metadata"]["annotations"][contract.ANN_ASSIGNMENT])["gpuIndices"][0]
    assert adversary.check_probe(seen, own, FAKE_GPUS) == [], json.dumps(seen)
    # On the host: what it wrote is in its lane's own pipe directory; there is no node-wide one.
    mps = node.host_dir / "mps"
    uids = {p: get_pod(node, namespace, p)["metadata"]["uid"] for p in ("prober", "neighbour")}
    assert (mps / "lanes" / uids["prober"] / "pipe" / "probe-a").exists()
    assert not (mps / "pipe").exists() and not (mps / "shm").exists()
    # (d) Its env said 100 % and 40 GiB; its daemon still holds the lane's 10 % and 1024 MiB.
    assert seen["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10" and seen["raised"] == 0, seen["env"]
    held = adversary.held_limits(mps / "lanes" / uids["prober"] / "pipe", "legacy")
    assert held == {"pinned-memory-limit": "1024M", "active-thread-percentage": "10.0"}, held
    # The Node says what enforces each limit: each lane's (fake) MPS daemon, its own directories, its GPU's
    # device nodes and EXCLUSIVE_PROCESS where one daemon serves a GPU.
    status, got = node.plane.request("GET", f"/api/v1/nodes/{node.name}")
    assert status == 200, got
    said = json.loads(got["metadata"]["annotations"][contract.ANN_NODE_LANE_ENFORCEMENT])
    assert said == {
        "memory": "mps-daemon-per-lane",
        "compute": "mps-daemon-per-lane",
        "isolation": "lane-directories",
        "devices": "device-nodes+exclusive-process",
    }
    for name in uids:
        status, body = node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert status == 200, body
    # Released with their pods: the agent removes the lanes' directories on its next rounds.
    wait_until(
        lambda: not any((mps / "lanes" / u).exists() for u in uids.values()),
        180,
        "the lanes' directories to go",
    )


def gpu_slots(node: Node) -> int:
    status, body = node.plane.request("GET", f"/api/v1/nodes/{node.name}")
    return (
        int((body.get("status") or {}).get("allocatable", {}).get(contract.RESOURCE_GPU, 0))
        if status == 200
        else 0
    )


def create(node: Node, namespace: str, obj: dict[str, Any]) -> None:
    status, body = node.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", obj)
    assert status == 201, body


def get_pod(node: Node, namespace: str, name: str) -> dict[str, Any]:
    status, body = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert status == 200, body
    return dict(body)


def events(node: Node, namespace: str) -> list[dict[str, Any]]:
    status, body = node.plane.request("GET", f"/api/v1/namespaces/{namespace}/events")
    assert status == 200, body
    return list(body["items"])


def test_the_lane_audit_finds_two_pods_whose_lanes_were_swapped_and_deletes_them(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    """The agent's audit against the real kubelet's PodResources API. The swap is forced where the agent keeps
    its side of the record: the `tessera.io/allocated` annotations of two running pods are exchanged, so each
    pod's container holds the slots Allocate served the other with — what a wrong guess used to leave."""
    names = ["swap-a", "swap-b"]
    for name in names:
        pod = lane_pod(node, name)
        pod["spec"]["containers"][0]["command"] = ["sleep", "3600"]
        status, body = node.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert status == 201, body
    running = wait_until(
        lambda: (
            len(got := [p for p in pods(node, namespace) if p["metadata"]["name"] in names]) == 2
            and all(ready(p) and contract.ANN_ALLOCATED in p["metadata"]["annotations"] for p in got)
            and got
        ),
        180,
        f"two lane pods running\n{describe(node, namespace)}",
    )
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running}
    allocated = {p["metadata"]["name"]: p["metadata"]["annotations"][contract.ANN_ALLOCATED] for p in running}
    assert allocated["swap-a"] != allocated["swap-b"]
    for name, other in zip(names, reversed(names), strict=True):
        status, body = node.plane.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": {contract.ANN_ALLOCATED: allocated[other]}}},
            content_type="application/merge-patch+json",
        )
        assert status == 200, body

    def gone() -> bool:
        now = {p["metadata"]["name"]: p for p in pods(node, namespace)}
        return all(
            n not in now
            or now[n]["metadata"]["uid"] != uids[n]
            or now[n]["metadata"].get("deletionTimestamp")
            for n in names
        )

    wait_until(
        gone, 120, f"the audit to delete both pods (two audits 10 s apart)\n{describe(node, namespace)}"
    )
    found = {
        e["involvedObject"]["name"]: e["message"]
        for e in events(node, namespace)
        if e["reason"] == "LaneMismatch" and e["involvedObject"]["kind"] == "Pod"
    }
    assert set(found) == set(names), found
    assert "which Allocate served with pod " + f"{namespace}/swap-b's lane" in found["swap-a"]
    status, body = node.plane.request("GET", "/api/v1/namespaces/default/events")
    assert status == 200, body
    assert [
        e for e in body["items"] if e["reason"] == "LaneMismatch" and e["involvedObject"]["kind"] == "Node"
    ]


LEASED = """
import json, os, signal, socket, sys, time
from pathlib import Path
marks, pod = Path("/marks"), socket.gethostname()
def mark(what, **extra):
    (marks / f"{pod}.{what}").write_text(json.dumps({"t": time.time(), **extra}))
def checkpoint(signum, frame):
    mark("sigterm")
    # The checkpoint: it takes until the test has looked at the terminating pod (at most 10 s), plus 2 s.
    deadline = time.monotonic() + 10
    while not (marks / f"{pod}.release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2)
    mark("checkpointed")
    sys.exit(0)
signal.signal(signal.SIGTERM, checkpoint)
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "TESSERA_"))}
mark("started", env=env)
while True:
    time.sleep(1)  # training steps, until the lease moves
"""


def leased_app(node: Node, name: str, max_gpus: int, marks: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": name},
        "spec": {
            "template": workload_template(node, "train", ["python", "-c", LEASED], host_dir=("marks", marks)),
            "jobs": [{"name": "j", "iterTotal": 100000, "iterTimeSerialSeconds": 1.0, "maxGPUs": max_gpus}],
        },
    }


def test_a_second_app_takes_a_gpu_by_lease_and_the_first_checkpoints_on_sigterm(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    marks = node.host_dir / f"marks-{namespace}"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL_APP}"

    def started(pod: str) -> dict[str, Any] | None:
        f = marks / f"{pod}.started"
        return json.loads(f.read_text()) if f.exists() else None

    def running_pod(app: str) -> dict[str, Any] | None:
        """The App's pod once its container has started (its `started` mark), not one being deleted."""
        for pod in pods(node, namespace, f"{contract.LABEL_APP}={app}"):
            if not pod["metadata"].get("deletionTimestamp") and started(pod["metadata"]["name"]):
                return pod
        return None

    status, got = node.plane.request("POST", path, leased_app(node, "first", 2, str(marks)))
    assert status == 201, got
    try:
        first = wait_until(lambda: running_pod("first"), 240, "the first App's job running on both GPUs")
        first_name = first["metadata"]["name"]
        first_gpus = started(first_name)["env"][contract.ENV_CUDA_VISIBLE_DEVICES].split(",")  # type: ignore[index]
        assert len(first_gpus) == 2, first_gpus
        status, got = node.plane.request("POST", path, leased_app(node, "second", 1, str(marks)))
        assert status == 201, got

        # The next round (at the first App's lease expiry) gives the second App a GPU: the first App's pod is
        # deleted with the checkpoint grace, and its container gets SIGTERM.
        t0 = time.monotonic()
        wait_until(
            lambda: (marks / f"{first_name}.sigterm").exists(), 3 * LEASE_S + 120, "SIGTERM in the first job"
        )
        terminating = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{first_name}")
        assert isinstance(terminating, dict) and terminating["metadata"].get("deletionTimestamp"), terminating
        assert terminating["metadata"]["deletionGracePeriodSeconds"] == CHECKPOINT_GRACE_S
        (marks / f"{first_name}.release").touch()
        wait_until(
            lambda: (marks / f"{first_name}.checkpointed").exists(), CHECKPOINT_GRACE_S + 30, "the checkpoint"
        )

        second = wait_until(lambda: running_pod("second"), 240, "the second App's job running")
        successor = wait_until(
            lambda: (p := running_pod("first")) and p["metadata"]["name"] != first_name and p,
            240,
            "the first App's successor pod running",
        )
        node.timings["lease move: SIGTERM to both Apps running"] = time.monotonic() - t0
    except TimeoutError as err:
        apps = {n: (node.plane.get(f"{path}/{n}") or {}).get("status") for n in ("first", "second")}
        raise AssertionError(f"{err}\nApps: {json.dumps(apps)[:3000]}\n{describe(node, namespace)}") from err

    sigterm = json.loads((marks / f"{first_name}.sigterm").read_text())["t"]
    checkpointed = json.loads((marks / f"{first_name}.checkpointed").read_text())["t"]
    assert checkpointed - sigterm >= 2  # the container ran on after SIGTERM: the grace was honoured
    # The successor runs on its new assignment, one GPU of the two, the second App on the other; it started
    # only once its predecessor had checkpointed and exited.
    mine = started(successor["metadata"]["name"])["env"][contract.ENV_CUDA_VISIBLE_DEVICES]  # type: ignore[index]
    theirs = started(second["metadata"]["name"])["env"][contract.ENV_CUDA_VISIBLE_DEVICES]  # type: ignore[index]
    assert mine in first_gpus and theirs in first_gpus and mine != theirs, (first_gpus, mine, theirs)
    assert started(successor["metadata"]["name"])["t"] > checkpointed  # type: ignore[index]
    assignment = json.loads(successor["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert assignment["gpuUUIDs"] == [mine], assignment


WORKER = (
    "tessera worker --write-demo-model /tmp/model.onnx && "
    'exec tessera worker --model /tmp/model.onnx --name "$TESSERA_MODEL" --host 0.0.0.0 --port 9001'
)
# A static model declared slow (ℓ(1) = 200 ms, ℓ(2) = 400 ms) under a 1 s SLO: the best batch within half the
# SLO is 2 at 400 ms, 5 requests/s per replica. 2 expected requests/s → one replica; a few clients in a
# closed loop offer more than 5 → two (the most the node's two GPUs hold, and placement.maxGPUs).
DEMO_WIDTH = 256  # `tessera worker --write-demo-model`'s


def modeldeployment(node: Node) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_MODELDEPLOYMENT,
        "metadata": {"name": "m"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": node.images["WORKER_IMAGE"],
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", WORKER],
                            "ports": [{"containerPort": 9001, "name": "http"}],
                        }
                    ]
                }
            },
            "model": {"name": "early-exit", "dynamic": False},
            "slo": {"latencyMs": 1000},
            "traffic": {"expectedRps": 2},
            "batching": {
                "supportedBatchSizes": [1, 2],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [200, 400]},
            },
            "placement": {"minGPUs": 1, "maxGPUs": 2},
            "gpu": {"lane": {"memoryMiB": 4096, "computePercent": 50}},
        },
    }


def serving_path(node: Node, namespace: str, model: str = "early-exit") -> str:
    """For a failed wait on a ModelDeployment "m": each hop of the serving path tried from the host, so the
    failure says which one is broken (the gateway's answer, each worker's, the cluster DNS's for the
    workers' names, which the gateway resolves on every health check)."""
    lines = []
    svc = node.plane.get(f"/api/v1/namespaces/{namespace}/services/m-gateway") or {}
    gateway_port = next(iter((svc.get("spec") or {}).get("ports") or []), {}).get("targetPort", 8000)
    for p in pods(node, namespace, f"{contract.LABEL_MODELDEPLOYMENT}=m"):
        ip = p.get("status", {}).get("podIP")
        role = p["metadata"]["labels"].get(contract.LABEL_ROLE)
        port = 9001 if role == "worker" else gateway_port
        url = f"http://{ip}:{port}/v2/models/{model}/ready"
        t0 = time.monotonic()
        answer = _get_text(url)[:200]
        lines.append(
            f"  {role} {p['metadata']['name']}: GET {url} -> {answer} in {time.monotonic() - t0:.2f}s"
        )
        if role == "gateway":
            lines.append(f"    its /stats: {_get_text(f'http://{ip}:{gateway_port}/stats')[:400]}")
            # The worker's name as the gateway resolves it, from inside its pod (its resolv.conf, the DNS
            # Service's ClusterIP through kube-proxy), timed.
            lookup = (
                "import socket,sys,time;t=time.monotonic();"
                "r=socket.getaddrinfo(sys.argv[1],9001,type=socket.SOCK_STREAM);"
                "print(sorted({a[4][0] for a in r}),f'{time.monotonic()-t:.2f}s')"
            )
            for w in pods(node, namespace, f"{contract.LABEL_MODELDEPLOYMENT}=m"):
                if w["metadata"]["labels"].get(contract.LABEL_ROLE) != "worker":
                    continue
                name = (
                    f"{w['spec'].get('hostname')}.{w['spec'].get('subdomain')}.{namespace}.svc.cluster.local"
                )
                t0 = time.monotonic()
                try:
                    got = node.plane.kubectl(
                        "exec", "-n", namespace, p["metadata"]["name"], "--",
                        "python3", "-c", lookup, name, check=False,
                    )  # fmt: skip
                    out = (got.stdout + got.stderr).strip()[-300:]
                except subprocess.TimeoutExpired as err:
                    out = repr(err)
                lines.append(f"    in the pod, getaddrinfo({name}) -> {out} ({time.monotonic() - t0:.2f}s)")
        if role == "worker" and node.dns is not None:
            name = f"{p['spec'].get('hostname')}.{p['spec'].get('subdomain')}.{namespace}.svc.cluster.local"
            t0 = time.monotonic()
            found = node.dns.lookup(name)
            lines.append(f"  cluster DNS {name} -> {found} in {time.monotonic() - t0:.2f}s")
            # The server thread's answer (is it keeping up?), and the kube-dns ClusterIP's (kube-proxy's UDP
            # rules), both from the host.
            lines.append(f"    queried at the server: {dns_query(name, (node.dns.address, node.dns.port))}")
            lines.append(f"    queried at its ClusterIP: {dns_query(name, (node.dns.service_ip, 53))}")
    if node.dns is not None:
        lines.append(f"  cluster DNS queries answered so far: {node.dns.queries}")
    lines.append(f"  threads of the test process: {sorted(t.name for t in threading.enumerate())}")
    lines += service_path(node, namespace, "m-gateway", f"/v2/models/{model}/ready")
    return "serving path from the host:\n" + "\n".join(lines)


def _get_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return f"{resp.status} {resp.read().decode(errors='replace')}"
    except urllib.error.HTTPError as err:
        return f"{err.code} {err.read().decode(errors='replace')}"
    except Exception as err:  # any failure is the diagnosis
        return repr(err)


def service_path(node: Node, namespace: str, service: str, path: str) -> list[str]:
    """A Service's hop from the host: a GET on a fresh connection to its ClusterIP, its EndpointSlices, the
    NAT rules and conntrack entries kube-proxy's rules made for that IP, and whether kube-proxy lives."""
    svc = node.plane.get(f"/api/v1/namespaces/{namespace}/services/{service}") or {}
    ip = (svc.get("spec") or {}).get("clusterIP")
    lines = [f"  service {service}: clusterIP {ip}, ports {(svc.get('spec') or {}).get('ports')}"]
    if not ip:
        return lines
    t0 = time.monotonic()
    answer = _get_text(f"http://{ip}{path}")[:300]
    lines.append(f"  GET http://{ip}{path} on a fresh connection -> {answer} in {time.monotonic() - t0:.2f}s")
    slices = node.plane.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name={service}"
    )
    for es in (slices or {}).get("items", []):
        eps = [(e.get("addresses"), e.get("conditions")) for e in es.get("endpoints") or []]
        lines.append(f"  endpointslice {es['metadata']['name']}: {eps} ports {es.get('ports')}")
    for argv in (["iptables-save", "-t", "nat"], ["conntrack", "-L", "-d", ip]):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as err:
            out = repr(err)
        hits = [line for line in out.splitlines() if ip in line]
        chains = {w for line in hits for w in line.split() if w.startswith("KUBE-SVC-")}
        hits += [line for line in out.splitlines() if any(f"-A {c} " in line for c in chains)]
        lines += [f"  {argv[0]}: {line}" for line in hits[:20]] or [f"  {argv[0]}: nothing for {ip}"]
    proxy = node.processes["kube-proxy"]
    lines.append(f"  kube-proxy exit code {proxy.popen.poll()}; its log's end:")
    lines += ["    " + line[:300] for line in proxy.tail(15).splitlines()]
    return lines


def test_a_modeldeployment_serves_tritonclient_through_its_service_and_scales_with_load(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    path = (
        f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL_MODELDEPLOYMENT}"
    )
    status, got = node.plane.request("POST", path, modeldeployment(node))
    assert status == 201, got

    def md() -> dict[str, Any]:
        return dict((node.plane.get(f"{path}/m") or {}).get("status") or {})

    def serving(role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in pods(node, namespace, f"{contract.LABEL_MODELDEPLOYMENT}=m")
            if p["metadata"]["labels"].get(contract.LABEL_ROLE) == role
            and ready(p)
            and not p["metadata"].get("deletionTimestamp")
        ]

    answers: list[str] = []  # the last answer through the ClusterIP, for a failure
    t0 = time.monotonic()
    try:
        wait_until(
            lambda: len(serving("worker")) == 1 and serving("gateway"), 300, "a worker and the gateway"
        )
        svc = node.plane.get(f"/api/v1/namespaces/{namespace}/services/m-gateway")
        assert isinstance(svc, dict), svc
        # The gateway's ClusterIP, from the host: kube-proxy's rules carry it to the gateway pod, and the
        # gateway reaches its worker by the worker's DNS name.
        client = httpclient.InferenceServerClient(f"{svc['spec']['clusterIP']}:80", network_timeout=30)

        def model_ready() -> bool:
            # is_model_ready says only False: keep the last answer's status and body for a failure
            response = client._get("v2/models/early-exit/ready", None, None)
            answers[:] = [f"{response.status_code} {response.read()[:200]!r}"]
            return bool(response.status_code == 200)

        wait_until(model_ready, 300, "the model ready behind the ClusterIP")
        node.timings["modeldeployment: created to ready behind its ClusterIP"] = time.monotonic() - t0
    except TimeoutError as err:
        logs = {
            p["metadata"]["name"]: pod_log(node, namespace, p["metadata"]["name"])[-2000:]
            for p in pods(node, namespace, f"{contract.LABEL_MODELDEPLOYMENT}=m")
        }
        raise AssertionError(
            f"{err}\nlast answer through the ClusterIP: {answers}\nstatus: {md()}\n{describe(node, namespace)}"
            f"\nlogs: {logs}\n{serving_path(node, namespace)}"
        ) from err

    rng = np.random.default_rng(0)

    def infer() -> None:
        x = rng.standard_normal((1, DEMO_WIDTH)).astype(np.float32)
        n = np.array([[int(rng.integers(1, 20))]], dtype=np.int64)
        inputs = [
            httpclient.InferInput("x", [1, DEMO_WIDTH], "FP32"),
            httpclient.InferInput("n", [1, 1], "INT64"),
        ]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(n)
        result = client.infer("early-exit", inputs)
        name = result.get_response()["outputs"][0]["name"]
        np.testing.assert_allclose(result.as_numpy(name), early_exit_reference(x, n), rtol=1e-4, atol=1e-4)

    infer()  # the right answer, computed by the worker's ONNX Runtime from what the client sent
    assert md().get("replicas") == 1, md()

    # Load: clients in a closed loop, until the operator has read the gateway's counters and scaled.
    stop = threading.Event()
    answered, failed = [0], [0]

    url = f"http://{svc['spec']['clusterIP']}/v2/models/early-exit/infer"
    request = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, DEMO_WIDTH], "data": [1.0] * DEMO_WIDTH},
                {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [3]},
            ]
        }
    ).encode()

    def client_loop() -> None:
        while not stop.is_set():
            req = urllib.request.Request(url, data=request, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
                answered[0] += 1
            except OSError:  # a drop, or a gateway rolled out for the new replica set closing connections
                failed[0] += 1
                stop.wait(0.5)  # back off: a client that fails at once must not spin

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(8)]
    t1 = time.monotonic()
    for t in threads:
        t.start()
    try:
        wait_until(
            lambda: md().get("replicas") == 2 and len(serving("worker")) == 2,
            420,
            "a second replica under load",
        )
        node.timings["modeldeployment: load to two replicas"] = time.monotonic() - t1
    except TimeoutError as err:
        raise AssertionError(
            f"{err}\nanswered {answered[0]}, failed {failed[0]}\nstatus: {md()}\n{describe(node, namespace)}"
        ) from err
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    st = md()
    assert st.get("observedLoadRps", 0) > 2, st  # more than the 2 requests/s it expected
    assert answered[0] > 0, (answered, failed)
    # The gateway now lists both workers and still answers right (a new gateway pod, if its config rolled out).
    wait_until(lambda: client.is_model_ready("early-exit"), 180, "the model ready after scaling")
    infer()
    client.close()


# --- faults: each recovery timed (node.timings, printed at the end of the session) ---------------------------


def component_pods(node: Node, component: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(node, NS, f"app.kubernetes.io/component={component}")
        if not p["metadata"].get("deletionTimestamp")
    ]


def container_ids(node: Node, namespace: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: cs["containerID"]
        for p in pods(node, namespace)
        for cs in p["status"].get("containerStatuses", [])
        if cs.get("containerID")
    }


def registrations(node: Node) -> int:
    """How often a device plugin registered tessera.io/gpu with this node's kubelets (their logs)."""
    logs = sorted(node.plane.workdir.glob("kubelet*.log"))
    return sum(
        1
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if "Got registration request from device plugin" in line and contract.RESOURCE_GPU in line
    )


def gpu_allocatable(node: Node) -> str:
    return str(
        ((node.node() or {}).get("status") or {}).get("allocatable", {}).get(contract.RESOURCE_GPU, "")
    )


def sleeper(node: Node, namespace: str, *, wait: bool = True) -> None:
    status, got = node.plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "containers": [
                    {
                        "name": "s",
                        "image": node.images["TESSERA_IMAGE"],
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", "import signal; signal.pause()"],
                    }
                ]
            },
        },
    )
    assert status == 201, got
    if wait:
        wait_until(
            lambda: any(ready(p) for p in pods(node, namespace)),
            120,
            "the sleeper pod to be Running and Ready",
        )


def test_kubelet_killed_and_restarted_keeps_pods_and_the_plugin_re_registers(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    sleeper(node, namespace)
    before = {**container_ids(node, namespace), **container_ids(node, NS)}
    registered = registrations(node)
    t0 = time.monotonic()
    node.restart("kubelet", kill=True)
    wait_until(
        lambda: registrations(node) > registered, 180, "the agent to register again with the new kubelet"
    )
    wait_until(
        lambda: node.ready() and gpu_allocatable(node) == str(FAKE_GPUS * SLOTS_PER_GPU), 180, "capacity"
    )
    node.timings["recovery: kubelet restart (plugin re-registered, node Ready)"] = time.monotonic() - t0
    after = {**container_ids(node, namespace), **container_ids(node, NS)}
    assert after == before  # the same containers: nothing was restarted
    assert all(ready(p) for p in pods(node, namespace) + pods(node, NS))


def test_containerd_restarted_keeps_containers_running(node: Node, release: AdminCLI, namespace: str) -> None:
    sleeper(node, namespace)
    before = {**container_ids(node, namespace), **container_ids(node, NS)}
    t0 = time.monotonic()
    node.restart("containerd")
    wait_until(lambda: node.ctr("version", check=False).returncode == 0, 120, "containerd to answer")
    # The kubelet sees the runtime again and a new pod starts.
    status, got = node.plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "after"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "c",
                        "image": node.images["TESSERA_IMAGE"],
                        "imagePullPolicy": "Never",
                        "command": ["true"],
                    }
                ],
            },
        },
    )
    assert status == 201, got
    wait_until(
        lambda: (
            (node.plane.get(f"/api/v1/namespaces/{namespace}/pods/after") or {})
            .get("status", {})
            .get("phase")
            == "Succeeded"
        ),
        180,
        "a pod started after the restart to succeed",
    )
    node.timings["recovery: containerd restart (a new pod ran)"] = time.monotonic() - t0
    after = {
        k: v for k, v in {**container_ids(node, namespace), **container_ids(node, NS)}.items() if k != "after"
    }
    assert after == before
    assert all(ready(p) for p in pods(node, NS))


def test_agent_pod_deleted_is_recreated_and_registers_again(node: Node, release: AdminCLI) -> None:
    (old,) = component_pods(node, "agent")
    registered = registrations(node)
    t0 = time.monotonic()
    status, got = node.plane.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{old['metadata']['name']}")
    assert status == 200, got

    def new_agent_registered() -> bool:
        agents = component_pods(node, "agent")
        return (
            len(agents) == 1
            and agents[0]["metadata"]["uid"] != old["metadata"]["uid"]
            and ready(agents[0])
            and registrations(node) > registered
        )

    wait_until(new_agent_registered, 180, "the DaemonSet's new agent pod to be Ready and registered")
    wait_until(lambda: gpu_allocatable(node) == str(FAKE_GPUS * SLOTS_PER_GPU), 120, "the GPU slots back")
    node.timings["recovery: agent pod deleted (new one registered)"] = time.monotonic() - t0


def steady_app(node: Node) -> dict[str, Any]:
    """An App with one 1-GPU job that runs until it is stopped: alone, it keeps its GPU lease after lease."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": "steady"},
        "spec": {
            "template": workload_template(node, "train", ["python", "-c", "import signal; signal.pause()"]),
            "jobs": [{"name": "j", "iterTotal": 100000, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1}],
        },
    }


def stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def test_operator_leader_deleted_the_standby_takes_over_without_duplicate_pods(
    node: Node, release: AdminCLI, namespace: str
) -> None:
    roles = operator_roles(node)
    assert roles is not None, "two operator replicas with distinct peering priorities"
    leader, standby = roles
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL_APP}"
    status, got = node.plane.request("POST", path, steady_app(node))
    assert status == 201, got
    selector = f"{contract.LABEL_APP}=steady"
    (before,) = wait_until(
        lambda: [p for p in pods(node, namespace, selector) if ready(p)] or None, 240, "the App's pod running"
    )
    seen: dict[str, str] = {}  # uid -> name of every pod of the App seen from here on

    def live_pods() -> list[dict[str, Any]]:
        got = pods(node, namespace, selector)
        seen.update({p["metadata"]["uid"]: p["metadata"]["name"] for p in got})
        live = [p for p in got if not p["metadata"].get("deletionTimestamp")]
        assert len(live) <= 1, f"two live pods for one 1-GPU job: {[p['metadata']['name'] for p in live]}"
        return live

    t0 = time.monotonic()
    status, got = node.plane.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{leader}")
    assert status == 200, got

    def resumed() -> bool:
        live_pods()
        return peering_state(pod_log(node, NS, standby)) == "active"

    wait_until(resumed, 180, "the standby to resume operations")
    node.timings["recovery: operator leader deleted (standby resumed)"] = time.monotonic() - t0
    resumed_at = time.time()

    def renewed_by_new_leader() -> bool:
        """A lease granted after the standby resumed: the new leader has run a round on the App."""
        live_pods()
        leases = ((node.plane.get(f"{path}/steady") or {}).get("status") or {}).get("leases") or []
        return any(stamp(le["expiresAt"]) >= resumed_at + LEASE_S - 1 for le in leases)

    wait_until(renewed_by_new_leader, 3 * LEASE_S + 120, "a lease renewed by the new leader")
    node.timings["recovery: operator leader deleted (a round of the new leader)"] = time.monotonic() - t0
    # Alone on the node, the App keeps its GPU: its pod is the one from before the takeover, and at no
    # point did a second pod of its job exist.
    (after,) = wait_until(lambda: [p for p in live_pods() if ready(p)] or None, 120, "the App's pod running")
    assert after["metadata"]["uid"] == before["metadata"]["uid"], (before["metadata"]["name"], seen)
    assert set(seen) == {before["metadata"]["uid"]}, seen
    # The Deployment's replacement joins as a peer (it may out-rank the survivor: then the survivor pauses).
    wait_until(
        lambda: len(ops := component_pods(node, "operator")) == 2 and all(ready(p) for p in ops),
        180,
        "the replacement operator pod to be Ready",
    )


def test_helm_uninstall_leaves_only_the_crds(node: Node, release: AdminCLI) -> None:
    node.pod_memory = {k: v for k, v in node.pod_memory_mib().items() if k.startswith(f"{NS}/")}
    t0 = time.monotonic()
    out = release.helm("uninstall", RELEASE, "-n", NS, "--timeout", "300s")
    node.timings["helm uninstall (cleanup Job ran)"] = time.monotonic() - t0
    assert f'release "{RELEASE}" uninstalled' in out.stdout, out
    wait_until(lambda: not pods(node, NS), 180, "every pod of the release to be gone")
    # Every object the chart rendered for this release is gone, cluster-scoped ones included.
    for obj in objects(render(chart_values(node), name=RELEASE, namespace=NS)):
        wait_until(
            lambda o=obj: node.plane.request("GET", api_path(o))[0] == 404, 120, f"{key(obj)} to be deleted"
        )
    for plural in (contract.PLURAL_APP, contract.PLURAL_TRIALGROUP, contract.PLURAL_MODELDEPLOYMENT):
        assert node.plane.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{contract.GROUP}"
        )
    # The post-delete hook removed the agent's inventory annotation from the Node, and its own Job,
    # ServiceAccount and rights are gone with it. (The kubelet keeps `tessera.io/gpu` in the Node's
    # capacity, at 0 allocatable, until it drops a plugin it has not heard from: its own state, not ours.)
    got = node.node() or {}
    assert contract.ANN_NODE_GPUS not in got["metadata"].get("annotations", {}), got["metadata"]
    assert reserve_taints(node) == [], got["spec"]  # and the taint gpuNodes.reserve had the agent set
    for obj in objects(render(chart_values(node), name=RELEASE, namespace=NS), hooks=True):
        wait_until(
            lambda o=obj: node.plane.request("GET", api_path(o))[0] == 404,
            120,
            f"hook {key(obj)} to be deleted",
        )
    assert released(release) == []  # the release's history (its Secrets) went too
