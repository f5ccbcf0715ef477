"""The chart with `lanes.api: auto` on the real node (Kubernetes 1.37, so DRA): the agent's DaemonSet runs the
DRA driver under its own ServiceAccount (the chart's grants), the chart's DeviceClass selects its GPUs, and a
pod's claim is allocated by kube-scheduler (the chart's tessera-scheduler, to which gpuNodes.reserve routes a
labelled namespace's pods) and prepared by the agent pod (issue 30).

Then the operator in DRA mode (the chart passes it `--lanes-api auto`, which its dry run resolves to dra): an App, a TrialGroup and a
ModelDeployment run end to end with no extender, each pod's ResourceClaimTemplate selecting the GPUs the
policy chose, and every container sees exactly those GPUs and that lane in the env of the agent's CDI device.
The node has two fake GPUs, so a choice can differ from what kube-scheduler's allocator would take unasked
(the first device that fits)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from tessera.api import contract

from tests.integration.k8s.admin_cli import AdminCLI
from tests.integration.k8s.controlplane import wait_until

from .node import Node
from .test_chart_on_node import (
    chart_values,
    describe,
    helm_install,
    modeldeployment,
    pod_log,
    pods,
    ready,
    route_to_tessera,
    serving_path,
    workload_template,
)
from .test_dra_on_node import (
    DEADLINE_S,
    GPU0,
    RESOURCE_API,
    SHOW_LANE,
    allocated_claims,
    cdi_specs,
    lane_env,
    lane_pod,
    lane_template,
    logged,
    phase,
    pod_claim,
    pod_claim_gone,
    published_slice,
)

NS = "tessera-dra"
RELEASE = "tessera-dra"
FAKE_GPUS = 2


@pytest.fixture(scope="module")
def dra_release(node: Node, admin_cli: AdminCLI) -> Iterator[AdminCLI]:
    if node.containerd_dir is None:
        pytest.fail("DRA needs CDI: run the node with the built containerd (TESSERA_NODE_CONTAINERD=built)")
    values: dict[str, Any] = chart_values(node)
    # auto leaves tessera.io/gpu unnamed by default (a fallback to the device plugin would need it so): asked for
    values["lanes"] = {"api": "auto", "dra": {"extendedResource": True}}
    values["agent"].update(
        {"fakeGpus": FAKE_GPUS, "kubeletRootDir": str(node.kubelet_root), "cdiDir": str(node.cdi_dir)}
    )
    # The operator creates a TrialGroup's trials and a deployment's replicas together, and kube-scheduler 1.37.2
    # can count one's claim twice while it is in flight, leaving another unschedulable until its flush of such
    # pods (docs/dra.md, "Lane pods created together"): the docs' bound on that wait, shorter for the deadlines.
    values["scheduler"]["kubeScheduler"]["extraArgs"] = ["--pod-max-in-unschedulable-pods-duration=30s"]
    t0 = time.monotonic()
    helm_install(node, admin_cli, RELEASE, values, NS)
    try:
        wait_until(
            lambda: len(got := pods(node, NS)) == 4 and all(ready(p) for p in got),
            300,
            "the chart's 4 pods to be Running and Ready",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{describe(node, NS)}") from err
    node.timings["chart ready (lanes.api auto = dra)"] = time.monotonic() - t0
    try:
        yield admin_cli
    finally:
        admin_cli.helm("uninstall", RELEASE, "-n", NS, "--timeout", "300s")
        # The slice is owned by the Node, which outlives the release.
        node.plane.request("DELETE", f"{RESOURCE_API}/resourceslices/{node.name}-{contract.DRA_DRIVER}")


def test_auto_on_137_runs_the_dra_driver_and_a_claim_gets_its_lane(
    node: Node, namespace: str, dra_release: AdminCLI
) -> None:
    status, dc = node.plane.request("GET", f"{RESOURCE_API}/deviceclasses/{contract.DRA_DEVICE_CLASS}")
    assert status == 200, dc
    # published by the agent pod with the chart's grants
    wait_until(lambda: published_slice(node) is not None, DEADLINE_S, "the agent pod's ResourceSlice")
    # The chart keeps its GPU node for tessera-scheduler (gpuNodes.reserve, as in every chart test here): a
    # user's pod with a claim gets there through a labelled namespace, and that scheduler allocates the claim.
    route_to_tessera(node, namespace)
    lane_template(node, namespace, "lane-30", "10Gi", "30")
    lane_pod(node, namespace, "p", "lane-30", sleep_s=3600)
    try:
        wait_until(
            lambda: phase(node, namespace, "p") == "Running" and logged(node, namespace, "p"),
            DEADLINE_S,
            "the lane pod to run",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{describe(node, namespace)}\n{describe(node, NS)}") from err
    claim = pod_claim(node, namespace, "p")
    assert claim is not None
    uid = claim["metadata"]["uid"]
    env = lane_env(node, namespace, "p")
    assert env["CUDA_VISIBLE_DEVICES"] == GPU0 and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["TESSERA_LANE_ID"] == uid
    # the chart's progress socket is mounted and named for this pod
    assert env["TESSERA_PROGRESS_ENDPOINT"].endswith(f"/v1/namespaces/{namespace}/pods/p/progress")
    assert cdi_specs(node, uid)
    node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/p")
    wait_until(lambda: not cdi_specs(node, uid), DEADLINE_S, "the agent pod to unprepare the claim")
    # The pod went through tessera-scheduler, whose bind wrote its GPU into the pod: the operator counts
    # GPU 0 as taken until the pod is gone, so the next test (which wants both GPUs) waits for that here.
    wait_until(
        lambda: node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/p")[0] == 404,
        DEADLINE_S,
        "the lane pod to be gone",
    )
    wait_until(lambda: pod_claim_gone(node, namespace, claim), DEADLINE_S, "the pod's claim to be deleted")


def test_a_pod_asking_tessera_gpu_runs_on_a_whole_gpu_the_scheduler_claimed_for_it(
    node: Node, namespace: str, dra_release: AdminCLI
) -> None:
    """A pod written for the device plugin (`tessera.io/gpu: 1`, no claim) on the chart's DRA lanes: the chart's
    DeviceClass names the extended resource (KEP-5004), kube-scheduler makes the pod a claim of one whole GPU,
    and the kubelet has the agent pod prepare it like any claim."""
    status, dc = node.plane.request("GET", f"{RESOURCE_API}/deviceclasses/{contract.DRA_DEVICE_CLASS}")
    assert status == 200 and dc["spec"]["extendedResourceName"] == contract.RESOURCE_GPU, dc
    wait_until(lambda: published_slice(node) is not None, DEADLINE_S, "the agent pod's ResourceSlice")
    route_to_tessera(node, namespace)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": node.images["TESSERA_IMAGE"], "imagePullPolicy": "Never",
                            "command": ["python", "-c", SHOW_LANE, "3600"],
                            "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}],
        },
    }  # fmt: skip
    status, got = node.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    assert status == 201, got
    try:
        wait_until(
            lambda: phase(node, namespace, "plain") == "Running" and logged(node, namespace, "plain"),
            DEADLINE_S,
            "the plain tessera.io/gpu pod to run",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{describe(node, namespace)}\n{describe(node, NS)}") from err
    got = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/plain")
    name = got["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = node.plane.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"]["computeShare"] == "100"
    uid = claim["metadata"]["uid"]
    env = lane_env(node, namespace, "plain")
    assert env["CUDA_VISIBLE_DEVICES"] == gpu_uuids(node)[int(result["device"].removeprefix("gpu-"))]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100" and env["TESSERA_LANE_ID"] == uid
    # Routed to tessera-scheduler (gpuNodes.reserve), the pod also went through the extender, whose bind
    # recorded the GPU of the claim kube-scheduler allocated for it (docs/dra.md, "Through tessera-scheduler").
    assignment = json.loads(got["metadata"]["annotations"][contract.ANN_ASSIGNMENT])
    assert assignment["gpuIndices"] == [int(result["device"].removeprefix("gpu-"))]
    node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/plain")
    wait_until(lambda: not cdi_specs(node, uid), DEADLINE_S, "the agent pod to unprepare the claim")
    wait_until(
        lambda: node.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/plain")[0] == 404,
        DEADLINE_S,
        "the plain pod to be gone",
    )
    # owned by the pod: the garbage collector deletes it (the next tests wait for no allocated claim)
    wait_until(
        lambda: pod_claim_gone(node, namespace, claim), DEADLINE_S, "the scheduler's claim to be deleted"
    )


def gpus_unclaimed(node: Node) -> bool:
    """No GPU is held by an earlier test: no claim holding a share of one, and no live pod placed on GPUs (the
    operator counts a pod's GPUs from its placement or assignment annotation until the pod ends, and the
    pods of earlier tests, here and in the chart tests before, go with their namespaces, in their own
    time). A test that wants both GPUs waits for this."""
    if allocated_claims(node):
        return False
    every = node.plane.get("/api/v1/pods") or {}
    return not [
        p
        for p in every.get("items", [])
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and {contract.ANN_PLACEMENT, contract.ANN_ASSIGNMENT} & set(p["metadata"].get("annotations") or {})
    ]


# --- the operator's pods in DRA mode ---------------------------------------------------------------------------


def gpu_uuids(node: Node) -> dict[int, str]:
    """The node's GPUs by index, as the agent published them (the operator's view reads the same)."""
    raw = ((node.node() or {}).get("metadata", {}).get("annotations") or {}).get(contract.ANN_NODE_GPUS, "[]")
    return {int(g["index"]): str(g["uuid"]) for g in json.loads(raw)}


def placed(pod: dict[str, Any]) -> list[int]:
    where = json.loads(pod["metadata"]["annotations"][contract.ANN_PLACEMENT])
    return [int(i) for i in where["gpuIndices"]]


def allocated_devices(node: Node, namespace: str, pod: dict[str, Any]) -> list[str]:
    """The devices kube-scheduler allocated to the pod's claim (read while the pod runs: the claim goes
    with it), in request order."""
    claim = pod_claim(node, namespace, pod["metadata"]["name"])
    assert claim is not None and claim["status"].get("allocation"), claim
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def selected_uuids(node: Node, namespace: str, pod: dict[str, Any]) -> list[str]:
    """The UUIDs the pod's ResourceClaimTemplate (the operator's) selects, in request order."""
    path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates/{pod['metadata']['name']}"
    answers: list[tuple[int, Any]] = []

    def read() -> tuple[int, Any] | None:
        # A busy API server may answer a GET with a 429 or 5xx: retried; a 404 is an answer.
        answers.append(node.plane.request("GET", path))
        return answers[-1] if answers[-1][0] in (200, 404) else None

    try:
        status, got = wait_until(read, 60, f"a readable {path}")
    except TimeoutError as err:
        raise AssertionError(f"{err}: {answers[-3:]}") from err
    holder = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}") or {}
    assert status == 200, (
        f"{path}: 404; its pod is deleting since {holder.get('metadata', {}).get('deletionTimestamp')}"
    )
    exprs = [
        r["exactly"]["selectors"][0]["cel"]["expression"] for r in got["spec"]["spec"]["devices"]["requests"]
    ]
    return [e.rsplit("==", 1)[1].strip().strip('"') for e in exprs]


def lane_line(log: str) -> dict[str, str]:
    line = next((x for x in log.splitlines() if x.startswith("LANE ")), None)
    assert line is not None, log
    return dict(json.loads(line[5:]))


def operator_pods(node: Node, namespace: str, label: str, value: str) -> list[dict[str, Any]]:
    return [
        p for p in pods(node, namespace, f"{label}={value}") if not p["metadata"].get("deletionTimestamp")
    ]


def cr_path(namespace: str, plural: str) -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{plural}"


JOB = """
import json, os, socket, sys, time
from pathlib import Path
from tessera import sdk
total, release = int(sys.argv[1]), Path("/marks") / (socket.gethostname() + ".release")
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "TESSERA_"))}
print("LANE " + json.dumps(env), flush=True)
for i in range(1, total):  # one short of the total: the job ends by exiting 0, not by a report
    time.sleep(0.5)
    print("progress", i, sdk.report_progress(i, total), flush=True)
deadline = time.monotonic() + 240  # held until the test has read the claim, which goes with the pod
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
print("DONE", flush=True)
"""


def test_dra_app_job_runs_on_its_leased_gpus_and_reports_progress(
    node: Node, namespace: str, dra_release: AdminCLI
) -> None:
    """Themis leases both GPUs to the job (in one round, or in two); its pod's claim selects them (two
    requests, by UUID), and the container sees both, in the lease's order; the job's progress reports pass
    the agent's DRA check."""
    wait_until(lambda: gpus_unclaimed(node), DEADLINE_S, "earlier tests' claims to release the GPUs")
    marks = node.host_dir / f"marks-{namespace}"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    iters = 6
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": "train"},
        "spec": {
            "template": workload_template(
                node, "train", ["python", "-c", JOB, str(iters)], host_dir=("marks", marks)
            ),
            "jobs": [{"name": "j", "iterTotal": iters, "iterTimeSerialSeconds": 0.5, "maxGPUs": FAKE_GPUS}],
        },
    }
    path = cr_path(namespace, contract.PLURAL_APP)
    status, got = node.plane.request("POST", path, body)
    assert status == 201, got

    def app() -> dict[str, Any]:
        return dict((node.plane.get(f"{path}/train") or {}).get("status") or {})

    def reported() -> tuple[dict[str, Any], str] | None:
        # The job's pod on both GPUs: when the operator's view frees a GPU a moment after an earlier test's
        # pod is gone, the job leases one GPU, then the other in the next round, and is re-planned onto both.
        for pod in operator_pods(node, namespace, contract.LABEL_APP, "train"):
            if len(placed(pod)) < FAKE_GPUS:
                continue
            log = pod_log(node, namespace, pod["metadata"]["name"])
            if f"progress {iters - 1} " in log:
                return pod, log
        return None

    t0 = time.monotonic()
    try:
        pod, log = wait_until(reported, 300, "the job's pod to report its progress")
        leases = app().get("leases") or []
        uuids = gpu_uuids(node)
        lane = lane_line(log)
        devices = allocated_devices(node, namespace, pod)
        selected = selected_uuids(node, namespace, pod)  # the template goes with the pod, once done
        (marks / f"{pod['metadata']['name']}.release").touch()
        wait_until(lambda: app().get("phase") == "Succeeded", 300, "the App to succeed")
        node.timings["dra: App created to Succeeded"] = time.monotonic() - t0
    except TimeoutError as err:
        raise AssertionError(f"{err}\nApp status: {app()}\n{describe(node, namespace)}") from err
    chosen = placed(pod)
    assert sorted(chosen) == list(range(FAKE_GPUS))
    assert sorted(int(i) for lease in leases for i in lease["gpuIndices"]) == sorted(chosen), leases
    assert selected == [uuids[i] for i in chosen]
    assert devices == [f"gpu-{i}" for i in chosen]  # kube-scheduler took exactly what was selected
    assert lane[contract.ENV_CUDA_VISIBLE_DEVICES] == ",".join(uuids[i] for i in chosen), lane
    assert lane[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "100"
    assert lane[contract.ENV_RANK] == "0" and lane[contract.ENV_WORLD_SIZE] == "1"
    assert pod["spec"]["nodeName"] == node.name
    assert pod["spec"]["schedulerName"] == "default-scheduler"  # no extender in the way
    # the progress went through the socket, past the agent's check of the pod's prepared claim
    got = node.plane.get(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}")
    if isinstance(got, dict):
        assert json.loads(got["metadata"]["annotations"][contract.ANN_PROGRESS])["iterations"] == iters - 1


TRIAL = """
import json, os, sys, time
from pathlib import Path
from tessera import sdk
name, total = os.environ["TESSERA_TRIAL"], int(sys.argv[1])
print("LANE " + json.dumps({k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "TESSERA_"))}), flush=True)
barrier = Path("/barrier")  # all three trials run at once: each marks itself and waits for the others
(barrier / name).touch()
deadline = time.monotonic() + 240
while len(list(barrier.glob("[abc]"))) < 3:
    if time.monotonic() > deadline:
        sys.exit("the other trials never started")
    time.sleep(0.2)
for i in range(1, total + 1):
    time.sleep(0.5)
    sdk.report_progress(i, total, loss=1.0 / i)
while not (barrier / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.2)  # held until the test has read the claims
print("DONE", flush=True)
"""


def test_dra_trialgroup_packs_three_trials_on_the_planned_gpu(
    node: Node, namespace: str, dra_release: AdminCLI
) -> None:
    """Fluid packs three trials on the group's one GPU: three claims of a third each, all selecting that GPU,
    running at once with their lanes; the trials' progress reaches the operator through the agent."""
    wait_until(lambda: gpus_unclaimed(node), DEADLINE_S, "earlier tests' claims to release the GPUs")
    barrier = node.host_dir / f"barrier-{namespace}"
    barrier.mkdir(mode=0o777)
    barrier.chmod(0o777)
    budget = 4
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": "tg"},
        "spec": {
            "template": workload_template(
                node, "trial", ["python", "-c", TRIAL, str(budget)], host_dir=("barrier", barrier)
            ),
            "gpus": 1,
            "fluid": {"maxPackPerGPU": 3},
            "trials": [
                {"name": n, "budgetIterations": budget, "iterTimeSeconds": 0.5, "config": {}} for n in "abc"
            ],
        },
    }
    path = cr_path(namespace, contract.PLURAL_TRIALGROUP)
    status, got = node.plane.request("POST", path, body)
    assert status == 201, got

    def tg() -> dict[str, Any]:
        return dict((node.plane.get(f"{path}/tg") or {}).get("status") or {})

    def all_reported() -> list[dict[str, Any]] | None:
        got = operator_pods(node, namespace, contract.LABEL_TRIALGROUP, "tg")
        running = [p for p in got if p["status"].get("phase") == "Running"]
        return running if len(running) == 3 and tg().get("trialsDone") == 3 else None

    t0 = time.monotonic()
    try:
        trial_pods = wait_until(all_reported, 300, "three trials running together and done reporting")
        uuids = gpu_uuids(node)
        pool = json.loads(
            (node.plane.get(f"{path}/tg") or {})["metadata"]["annotations"][contract.ANN_GPU_POOL]
        )
        seen = {
            p["metadata"]["labels"][contract.LABEL_TRIAL]: (
                p,
                lane_line(pod_log(node, namespace, p["metadata"]["name"])),
                allocated_devices(node, namespace, p),
                selected_uuids(node, namespace, p),
            )
            for p in trial_pods
        }
        (barrier / "release").touch()
        wait_until(lambda: tg().get("phase") == "Succeeded", 300, "the TrialGroup to succeed")
        node.timings["dra: TrialGroup created to Succeeded"] = time.monotonic() - t0
    except TimeoutError as err:
        raise AssertionError(f"{err}\nstatus: {tg()}\n{describe(node, namespace)}") from err
    (gpu,) = pool
    index = int(gpu.rsplit("/", 1)[1])
    usable = int(
        published_slice(node)["spec"]["devices"][index]["capacity"]["memory"]["value"].removesuffix("Mi")
    )  # type: ignore[index]
    for name, (pod, lane, devices, selected) in seen.items():
        assert placed(pod) == [index], name
        assert selected == [uuids[index]]
        assert devices == [f"gpu-{index}"]
        assert lane[contract.ENV_CUDA_VISIBLE_DEVICES] == uuids[index], lane
        assert lane[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "33", lane
        assert lane[contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == f"0={usable // 3}M", lane
        assert lane["TESSERA_TRIAL"] == name
    assert len({lane[contract.ENV_LANE_ID] for _, lane, _, _ in seen.values()}) == 3
    st = tg()
    assert {t["name"]: t["phase"] for t in st["trials"]} == dict.fromkeys("abc", "Completed"), st


WORKER = (
    "env | grep -E '^(CUDA_|TESSERA_)' | sort | sed 's/^/LANE_ENV /'; "
    "tessera worker --write-demo-model /tmp/model.onnx && "
    'exec tessera worker --model /tmp/model.onnx --name "$TESSERA_MODEL" --host 0.0.0.0 --port 9001'
)


def test_dra_modeldeployment_spreads_its_replicas_as_placed_and_serves(
    node: Node, namespace: str, dra_release: AdminCLI
) -> None:
    """Two replicas of half a GPU each: the operator places one per GPU, where kube-scheduler's allocator,
    unasked, would put both on gpu-0 (the first device they fit). Each worker runs on the GPU of its
    replica group, and the model answers behind the gateway's ClusterIP."""
    wait_until(lambda: gpus_unclaimed(node), DEADLINE_S, "earlier tests' claims to release the GPUs")
    md = modeldeployment(node)
    md["spec"]["traffic"]["expectedRps"] = 8  # 5 requests/s per replica (see test_chart_on_node): two
    md["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", WORKER]
    path = cr_path(namespace, contract.PLURAL_MODELDEPLOYMENT)
    status, got = node.plane.request("POST", path, md)
    assert status == 201, got

    def st() -> dict[str, Any]:
        return dict((node.plane.get(f"{path}/m") or {}).get("status") or {})

    def serving(role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in operator_pods(node, namespace, contract.LABEL_MODELDEPLOYMENT, "m")
            if p["metadata"]["labels"].get(contract.LABEL_ROLE) == role and ready(p)
        ]

    def model_ready() -> bool:
        svc = node.plane.get(f"/api/v1/namespaces/{namespace}/services/m-gateway")
        if not isinstance(svc, dict):
            return False
        url = f"http://{svc['spec']['clusterIP']}/v2/models/early-exit/ready"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def two_workers() -> list[dict[str, Any]] | None:
        got = serving("worker")
        return got if len(got) == 2 and serving("gateway") else None

    t0 = time.monotonic()
    try:
        workers = wait_until(two_workers, 300, "two workers and the gateway ready")
        wait_until(model_ready, 300, "the model ready behind the gateway's ClusterIP")
        node.timings["dra: ModelDeployment created to ready behind its ClusterIP"] = time.monotonic() - t0
        groups = st().get("groups") or []
        uuids = gpu_uuids(node)
        seen = [
            (
                w,
                allocated_devices(node, namespace, w),
                lane_env_lines(pod_log(node, namespace, w["metadata"]["name"])),
            )
            for w in workers
        ]
    except TimeoutError as err:
        raise AssertionError(
            f"{err}\nstatus: {st()}\n{describe(node, namespace)}\n{serving_path(node, namespace)}"
        ) from err
    indices = sorted(placed(w)[0] for w, _, _ in seen)
    assert indices == [0, 1], indices  # one replica per GPU: the operator's placement, not first fit
    assert sorted(groups) == [f"{node.name}/{i}" for i in indices], groups
    for worker, devices, lane in seen:
        (index,) = placed(worker)
        assert selected_uuids(node, namespace, worker) == [uuids[index]]
        assert devices == [f"gpu-{index}"]
        assert lane[contract.ENV_CUDA_VISIBLE_DEVICES] == uuids[index], lane
        assert lane[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "50", lane
        assert lane[contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=4096M", lane


def lane_env_lines(log: str) -> dict[str, str]:
    return dict(
        line[len("LANE_ENV ") :].split("=", 1) for line in log.splitlines() if line.startswith("LANE_ENV ")
    )
