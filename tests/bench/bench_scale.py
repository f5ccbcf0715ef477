"""Scheduling at the scale users run: thousands of kwok nodes on the real control plane, side by side.

    .venv/bin/python tests/bench/bench_scale.py [--nodes 1000,5000] [--configs kube-scheduler,tessera,dra]
        [--rate 100] [--max-pods 6000] [--seed 0] [--stretch 1] [--no-operator] [--controller-qps 0]
        [--quiet 60]

For each node count it starts a fresh control plane (tests/integration/k8s/controlplane.py: etcd,
kube-apiserver, kube-controller-manager, all built from Go modules), kwok (built from its Go module by
hack/kwok-assets.sh) playing that many GPU nodes with the capacities of Alibaba's node list (tiled past its
1,213 nodes), the chart's RBAC, CRDs and namespace routing (gpuNodes.reserve on: every node carries the
agent's taint), and `tessera operator` as its own process (it watches every pod and node, as deployed).
Then, one configuration after the other on the same nodes, it replays pods drawn from Alibaba's pod list
(FGD's sampling: with replacement until the GPUs asked reach the cluster's capacity, at most --max-pods),
created at a fixed rate (--rate pods/s) and run by kwok for the duration the trace gives them (× --stretch;
pods the trace never deleted run on):

- kube-scheduler: kube-scheduler alone, the default profile — the baseline. Pods ask `tessera.io/gpu` (the
  GPUs they span) as a plain extended resource and tolerate the taint themselves; it knows nothing of GPU
  memory or compute shares, so its GPU allocation is not comparable and is not reported.
- tessera: tessera-scheduler, kube-scheduler with the extender, as the chart configures it (every feasible
  node scored; the extender filters, prioritizes and binds; the one-pod-at-a-time handoff on, kwok marking
  each pod allocated as the agent's Allocate would). Pods are the packing replay's: `tessera.io/gpu`,
  `tessera.io/gpu-memory`, `tessera.io/gpu-compute`, routed by the chart's MutatingAdmissionPolicy.
- dra: kube-scheduler's default profile with DRA's structured allocator: one ResourceSlice per node as the
  agent's DRA driver publishes it (memory, computeShare, clients as consumable capacity), the chart's
  DeviceClass, and each pod a ResourceClaimTemplate asking its lane (the chart's `lanes.api: dra`).
- tessera-adaptive (only when asked for): tessera, but with kube-scheduler's own adaptive
  `percentageOfNodesToScore` in place of the chart's 100, to show what scoring every node costs.

Per configuration: pods bound per second while a backlog waited (median of 5 s windows; the rate over the
whole replay beside it), creation → bound latency p50/p99 as this client saw it (the create call answered →
the watch showed a node), kube-scheduler's own `scheduler_pod_scheduling_sli_duration_seconds` p50/p99, the
extender's filter/prioritize/bind p50/p99 as its server measured them (kube-scheduler exports no per-extender
latency; its `scheduling_attempt_duration_seconds` includes the extender's calls and is shown too), CPU
seconds and peak RSS of kube-scheduler, the extender, the operator, kube-apiserver, etcd and kwok, and the
GPU share left unallocated once the arrivals asked for the whole cluster (only where they did). Ratios
against the baseline and the growth from the smallest to the largest node count close the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import http.client
import json
import math
import random
import secrets
import shutil
import signal
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.api import contract  # noqa: E402
from tessera.policy.lanes.fragmentation import Shape  # noqa: E402
from tessera.sim.packing.through_extender import nominal_nodes, pod_object  # noqa: E402
from tessera.sim.packing.trace import read_pods  # noqa: E402

from tests.bench.scale_measure import (  # noqa: E402
    Replay,
    Usage,
    buckets,
    minus,
    percentile,
    quantile,
    rss_mib,
    total,
)
from tests.integration.k8s.conftest import (  # noqa: E402
    TESSERA,
    Credentials,
    apply_chart_rbac,
    apply_crds,
    gpu_nodes_policy_objects,
    routed_to_tessera,
    run_scheduling,
)
from tests.integration.k8s.controlplane import ADMIN_TOKEN, ControlPlane, Process, wait_until  # noqa: E402
from tests.integration.kwok import harness as kwok  # noqa: E402
from tests.ports import free_port  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
CONFIGS = ("kube-scheduler", "tessera", "dra", "tessera-adaptive")
# tessera-adaptive: not in the default set; tessera-scheduler with kube-scheduler's own adaptive
# percentageOfNodesToScore instead of the chart's 100, to show what scoring every node costs at scale.
DEFAULT_CONFIGS = CONFIGS[:3]
SLOTS = 10  # lanes per GPU (agent.slotsPerGpu): tessera.io/gpu slots and the DRA `clients` capacity
GPU_MIB = (
    1000  # every GPU declared with 1000 MiB, as the packing replay does: a trace share of m milli is m MiB
)
RESULTS: list[Result] = []  # every replay measured so far (reported even when a later step fails)
MEMORY: list[Memory] = []
LOGS: Path | None = None  # --logs: where each replay's scheduler and extender logs are kept
QUIET_S = 60.0  # a replay ends when every pod is bound, or nothing bound for this long after the last create


# --- the workload --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    shape: Shape
    duration_s: float | None  # None: the trace never deleted it; it runs on


def workload(capacity_gpus: int, seed: int, max_pods: int, stretch: float) -> tuple[list[Arrival], bool]:
    """Pods drawn with replacement until the GPUs asked reach `capacity_gpus` (FGD's sampling), at most
    `max_pods`; True when the cap did not cut the stream (the arrivals asked for the whole cluster)."""
    path = TRACE / "openb_pod_list_default.csv"
    shapes = read_pods(path)
    with path.open() as f:
        rows = list(csv.DictReader(f))
    durations: list[float | None] = []
    for row in rows:
        end = row.get("deletion_time") or ""
        durations.append(max(1.0, (int(end) - int(row["creation_time"])) * stretch) if end else None)
    rng = random.Random(seed)
    out: list[Arrival] = []
    asked = 0.0
    while asked < capacity_gpus - 1e-9 and len(out) < max_pods:
        i = rng.randrange(len(shapes))
        out.append(Arrival(shapes[i], durations[i]))
        asked += shapes[i].gpu_share
    return out, asked >= capacity_gpus - 1e-9


def _with_duration(pod: dict[str, Any], a: Arrival) -> dict[str, Any]:
    if a.duration_s is not None:
        pod["metadata"].setdefault("annotations", {})[kwok.ANN_DURATION] = str(math.ceil(a.duration_s))
    return pod


def pod_for(config: str, i: int, a: Arrival) -> dict[str, Any]:
    """Pod i of the replay as each configuration asks for it (names are the same across configurations)."""
    s = a.shape
    base = pod_object(i, s)
    for key in ("uid", "resourceVersion", "namespace"):
        base["metadata"].pop(key, None)
    base.pop("status")
    container = base["spec"]["containers"][0]
    if config.startswith("tessera"):
        del base["spec"]["schedulerName"]  # the chart's MutatingAdmissionPolicy routes it
        return _with_duration(base, a)
    base["spec"]["schedulerName"] = "default-scheduler"
    base["spec"]["tolerations"] = [contract.gpu_node_toleration()]
    requests = {k: v for k, v in container["resources"]["requests"].items()}
    if config == "kube-scheduler":
        limits = {contract.RESOURCE_GPU: str(s.gpus)} if s.gpus else {}
        container["resources"] = {"requests": requests, "limits": limits}
        return _with_duration(base, a)
    # dra: the lane as a claim from the template of its shape
    container["resources"] = {"requests": requests}
    if s.gpus:
        base["spec"]["resourceClaims"] = [{"name": "lane", "resourceClaimTemplateName": template_name(s)}]
        container["resources"]["claims"] = [{"name": "lane"}]
    return _with_duration(base, a)


def template_name(s: Shape) -> str:
    return f"lane-{s.gpus}x{round(s.compute * 1000)}"


def claim_template(s: Shape) -> dict[str, Any]:
    milli = round(s.compute * 1000)
    exactly: dict[str, Any] = {
        "deviceClassName": contract.DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": s.gpus,
    }
    if milli < 1000:
        exactly["capacity"] = {
            "requests": {
                contract.DRA_CAPACITY_MEMORY: f"{milli}Mi",
                contract.DRA_CAPACITY_COMPUTE: str(max(1, milli // 10)),
            }
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(s)},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


# --- the cluster -------------------------------------------------------------------------------------------


@dataclass
class Cluster:
    cp: ControlPlane
    creds: dict[str, Credentials]
    nodes: list[dict[str, Any]]
    kwok: Process
    operator: Process | None
    gpus: int

    def pids(self) -> dict[str, int]:
        out = {p.name: p.popen.pid for p in self.cp.processes if p.name in ("kube-apiserver", "etcd")}
        out["kwok"] = self.kwok.popen.pid
        if self.operator is not None:
            out["operator"] = self.operator.popen.pid
        return out


def _apply(cp: ControlPlane, objs: list[dict[str, Any]]) -> None:
    manifest = "\n---\n".join(yaml.safe_dump(o) for o in objs)
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=manifest)


def namespace(cp: ControlPlane, name: str, labels: dict[str, str] | None = None) -> None:
    status, body = cp.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}}
    )
    assert status == 201, body


def start_operator(cp: ControlPlane, creds: Credentials) -> Process:
    argv = ["env", f"KUBECONFIG={creds.kubeconfig}", str(TESSERA), "operator", "--standalone",
            "--metrics-port", str(free_port()), "--liveness", ""]  # fmt: skip
    return cp.spawn("operator", argv)


@contextlib.contextmanager
def cluster(n_nodes: int, with_operator: bool, controller_qps: int = 0) -> Iterator[Cluster]:
    # kube-controller-manager's client (its resourceclaim controller creates each DRA pod's claim) is
    # limited to 20 requests/s by default; --controller-qps raises it as an admin running DRA at scale would.
    kcm = (
        (f"--kube-api-qps={controller_qps}", f"--kube-api-burst={2 * controller_qps}")
        if controller_qps
        else ()
    )
    with kwok.kwok_control_plane(controller_manager_args=kcm) as cp:
        t0 = time.monotonic()
        apply_crds(cp)
        creds = apply_chart_rbac(cp)
        policy = gpu_nodes_policy_objects()
        _apply(cp, policy)
        proc = kwok.start_kwok(cp)
        specs = nominal_nodes(kwok.trace_specs(n_nodes))  # 1000 MiB GPUs, as the packing replay declares them
        bodies = [kwok.node_body(n, reserve=True, slots_per_gpu=SLOTS) for n in specs]
        kwok.create_nodes(cp, bodies)
        gpus = sum(len(json.loads(b["metadata"]["annotations"][contract.ANN_NODE_GPUS])) for b in bodies)
        operator = start_operator(cp, creds["operator"]) if with_operator else None
        say(f"{n_nodes} kwok nodes ({gpus} GPUs) Ready in {time.monotonic() - t0:.0f} s")
        yield Cluster(cp, creds, bodies, proc, operator, gpus)


def say(msg: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def publish_slices(cp: ControlPlane, nodes: list[dict[str, Any]]) -> None:
    """One ResourceSlice per node, as the agent's DRA driver publishes it, and the chart's DeviceClass."""
    from tessera_agent.gpus.backend import GpuDevice
    from tessera_agent.gpus.fake_backend import FakeGpuBackend
    from tessera_agent.kubelet.dra_slice import device_class, resource_slice

    status, body = cp.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class())
    assert status in (201, 409), body
    for n in nodes:
        name = n["metadata"]["name"]
        inv = json.loads(n["metadata"]["annotations"][contract.ANN_NODE_GPUS])
        gpus = [
            GpuDevice(index=i, uuid=f"GPU-{name}-{i}", model=str(g.get("model", "")), memory_total_bytes=GPU_MIB << 20,
                      memory_reserved_bytes=0)
            for i, g in enumerate(inv)
        ]  # fmt: skip
        obj = resource_slice(name, FakeGpuBackend(gpus), slots=SLOTS, generation=1)
        status, body = cp.request("POST", "/apis/resource.k8s.io/v1/resourceslices", obj)
        assert status in (201, 409), body


# --- schedulers ----------------------------------------------------------------------------------------------


@dataclass
class Schedulers:
    """The processes a configuration runs and where their metrics are."""

    procs: dict[str, Process]
    scheduler_metrics: str
    extender_metrics: str | None = None


def _default_scheduler(cp: ControlPlane, creds: Credentials) -> tuple[Process, str]:
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(creds.kubeconfig)},
    }
    path = cp.workdir / f"default-scheduler-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = cp.spawn(
        f"kube-scheduler-{port}",
        [str(cp.assets / "kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1",
         f"--secure-port={port}", "--authorization-always-allow-paths=/metrics,/healthz,/readyz,/livez"],
    )  # fmt: skip
    return proc, f"https://127.0.0.1:{port}/metrics"


def scrape(url: str) -> str:
    ctx = ssl._create_unverified_context()  # the scheduler's self-signed serving certificate
    with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
        return str(resp.read().decode())


@contextlib.contextmanager
def schedulers(c: Cluster, config: str) -> Iterator[Schedulers]:
    creds = c.creds["scheduler"]
    if config.startswith("tessera"):
        score = {"percentageOfNodesToScore": 0} if config == "tessera-adaptive" else None
        with run_scheduling(c.cp, creds, scheduler_config=score) as s:
            procs = {"kube-scheduler": s.scheduler, "extender": s.extender}
            yield Schedulers(procs, s.scheduler_metrics_url, s.metrics_url)
        return
    proc, url = _default_scheduler(c.cp, creds)
    try:
        wait_until(lambda: scrape(url), 60, "kube-scheduler's /metrics", proc)
        yield Schedulers({"kube-scheduler": proc}, url)
    finally:
        proc.stop()


# --- one replay ------------------------------------------------------------------------------------------------


@dataclass
class Result:
    config: str
    nodes: int
    created: int
    replay: Replay
    full: bool
    unallocated: float | None
    sli: dict[float, float]
    attempt: dict[float, float]
    extender: dict[str, dict[float, float]]
    usage: Usage
    took: float
    notes: list[str] = field(default_factory=list)


async def _watch(
    session: aiohttp.ClientSession, base: str, ns: str, replay: Replay, stop: asyncio.Event
) -> None:
    rv = ""
    while not stop.is_set():
        url = f"{base}/api/v1/namespaces/{ns}/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=300"
        if rv:
            url += f"&resourceVersion={rv}"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=320)) as resp:
                async for line in resp.content:
                    ev = json.loads(line)
                    obj = ev["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev["type"] not in ("ADDED", "MODIFIED"):
                        continue
                    name = obj["metadata"]["name"]
                    node = obj["spec"].get("nodeName")
                    if node and name not in replay.bound:
                        replay.bound[name] = time.monotonic()
                        replay.node[name] = node
                        replay.unschedulable.discard(name)
                    elif not node and any(
                        cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable"
                        for cond in (obj.get("status") or {}).get("conditions") or []
                    ):
                        replay.unschedulable.add(name)
        except (TimeoutError, aiohttp.ClientError):
            await asyncio.sleep(0.5)


async def post_pod(
    session: aiohttp.ClientSession, ns: str, pod: dict[str, Any], replay: Replay
) -> str | None:
    """Create one pod (retried while the API server throttles); its creation time goes in `replay`. None
    once created, else why not."""
    for _ in range(20):
        async with session.post(f"/api/v1/namespaces/{ns}/pods", json=pod) as resp:
            if resp.status == 201:
                replay.created[pod["metadata"]["name"]] = time.monotonic()
                return None
            text = await resp.text()
            if resp.status != 429:
                return f"{resp.status}: {text[:200]}"
        await asyncio.sleep(0.5)
    return "throttled (HTTP 429) 20 times"


async def replay_pods(c: Cluster, ns: str, pods: list[dict[str, Any]], rate: float) -> Replay:
    """Create `pods` at `rate` per second; record when each is created and bound; return once every pod is
    bound or nothing was bound for QUIET_S after the last create."""
    replay = Replay()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ctx = ssl.create_default_context(cafile=str(c.cp.ca_file))
    conn = aiohttp.TCPConnector(ssl=ctx, limit=64)
    stop = asyncio.Event()
    async with aiohttp.ClientSession(c.cp.server, headers=headers, connector=conn) as session:
        watcher = asyncio.create_task(_watch(session, "", ns, replay, stop))
        sem = asyncio.Semaphore(48)
        errors: list[str] = []

        async def create(pod: dict[str, Any]) -> None:
            async with sem:
                error = await post_pod(session, ns, pod, replay)
                if error is not None:
                    errors.append(error)

        t0 = time.monotonic()
        tasks = []
        for i, pod in enumerate(pods):
            due = t0 + i / rate
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(create(pod)))
            if i % 500 == 0:
                say(f"  {i}/{len(pods)} created, {len(replay.bound)} bound")
        await asyncio.gather(*tasks)
        if errors:
            say(f"  {len(errors)} creates refused, first: {errors[0]}")
        last, seen = time.monotonic(), len(replay.bound)
        while len(replay.bound) < len(replay.created):
            await asyncio.sleep(1.0)
            if len(replay.bound) != seen:
                last, seen = time.monotonic(), len(replay.bound)
                say(f"  {seen}/{len(replay.created)} bound, {len(replay.unschedulable)} unschedulable")
            elif time.monotonic() - last > QUIET_S or (
                # the rest found unschedulable, and nothing bound for a while (kube-scheduler retries them)
                seen + len(replay.unschedulable) >= len(replay.created) and time.monotonic() - last > 10
            ):
                break
        stop.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return replay


def clear(cp: ControlPlane, ns: str) -> None:
    """Delete the replay's pods and wait until they are gone. A collection delete of thousands of pods
    outlasts the API server's 60 s request timeout: it is repeated until one finishes."""
    req = urllib.request.Request(
        f"{cp.server}/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0",
        method="DELETE",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    for _ in range(30):
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=120):
                break
        except (OSError, http.client.HTTPException) as err:
            say(f"  deleting the pods of {ns}: {err!r}; again")
    wait_until(lambda: not (cp.get(f"/api/v1/namespaces/{ns}/pods?limit=1") or {}).get("items"), 600,
               f"the pods of {ns} to be gone")  # fmt: skip


def unallocated_share(arrivals: list[Arrival], replay: Replay, gpus: int) -> float:
    """Percent of the cluster's GPUs not held by a bound pod, counting every bound pod (finished or not)."""
    held = sum(a.shape.gpu_share for i, a in enumerate(arrivals) if f"p{i}" in replay.bound)
    return 100 * max(0.0, 1 - held / gpus)


def run_config(c: Cluster, config: str, arrivals: list[Arrival], full: bool, rate: float) -> Result:
    ns = f"{config}-{secrets.token_hex(2)}"
    labels = {contract.LABEL_GPU_NODES_NAMESPACE: "true"} if config.startswith("tessera") else {}
    namespace(c.cp, ns, labels)
    pods = [pod_for(config, i, a) for i, a in enumerate(arrivals)]
    if config == "dra":
        for shape in {template_name(a.shape): a.shape for a in arrivals if a.shape.gpus}.values():
            status, body = c.cp.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
                                        claim_template(shape))  # fmt: skip
            assert status == 201, body
    if config.startswith("tessera"):
        status, probe = c.cp.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", pods[0])
        assert status == 201 and routed_to_tessera(probe), probe
    with schedulers(c, config) as s:
        usage = Usage(c.pids() | {k: p.popen.pid for k, p in s.procs.items()})
        before_sched = scrape(s.scheduler_metrics)
        before_ext = _text(s.extender_metrics)
        usage.begin()
        t0 = time.monotonic()
        sampler_stop = False

        async def sampled() -> Replay:
            nonlocal sampler_stop

            async def sampler() -> None:
                while not sampler_stop:
                    usage.sample()
                    await asyncio.sleep(1.0)

            task = asyncio.create_task(sampler())
            try:
                return await replay_pods(c, ns, pods, rate)
            finally:
                sampler_stop = True
                await task

        replay = asyncio.run(sampled())
        took = time.monotonic() - t0
        usage.end()
        after_sched = scrape(s.scheduler_metrics)
        after_ext = _text(s.extender_metrics)
        if LOGS is not None:
            keep = LOGS / f"{len(c.nodes)}-{config}"
            keep.mkdir(parents=True, exist_ok=True)
            for k, p in {**s.procs, "kwok": c.kwok}.items():
                shutil.copy(p.log, keep / f"{k}.log")
    sli = minus(buckets(after_sched, "scheduler_pod_scheduling_sli_duration_seconds"),
                buckets(before_sched, "scheduler_pod_scheduling_sli_duration_seconds"))  # fmt: skip
    attempt = minus(buckets(after_sched, "scheduler_scheduling_attempt_duration_seconds", result="scheduled"),
                    buckets(before_sched, "scheduler_scheduling_attempt_duration_seconds", result="scheduled"))  # fmt: skip
    ext: dict[str, dict[float, float]] = {}
    if after_ext:
        for verb in ("filter", "prioritize", "bind"):
            name = "tessera_extender_request_duration_seconds"
            ext[verb] = minus(buckets(after_ext, name, verb=verb), buckets(before_ext or "", name, verb=verb))
    unalloc = unallocated_share(arrivals, replay, c.gpus) if full and config != "kube-scheduler" else None
    result = Result(
        config, len(c.nodes), len(replay.created), replay, full, unalloc, sli, attempt, ext, usage, took
    )
    say(f"{config}: {len(replay.bound)}/{len(replay.created)} bound in {took:.0f} s; clearing")
    RESULTS.append(result)
    clear(c.cp, ns)
    c.cp.request("DELETE", f"/api/v1/namespaces/{ns}")
    return result


def _text(url: str | None) -> str | None:
    if url is None:
        return None
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


# --- memory at scale ---------------------------------------------------------------------------------------


@dataclass
class Memory:
    nodes: int
    pods: int
    took: float
    rss: dict[str, float]


def bound_pod(i: int, node: dict[str, Any]) -> dict[str, Any]:
    """A running pod as the extender leaves it: bound, with its lane in `tessera.io/assignment` (a tenth of
    a 1000 MiB GPU, at most `SLOTS` lanes per GPU)."""
    from tessera.api.assignment import Assignment

    name = node["metadata"]["name"]
    gpus = json.loads(node["metadata"]["annotations"][contract.ANN_NODE_GPUS])
    g = (i // 7) % len(gpus)
    lane = Assignment(
        node=name, gpu_uuids=[str(gpus[g]["uuid"])], gpu_indices=[g], lane_id=f"lane-{i}", memory_mib=100,
        compute_percent=10,
    )  # fmt: skip
    ann = {contract.ANN_ASSIGNMENT: lane.to_annotation(), contract.ANN_ALLOCATED: "bench"}
    limits = {
        contract.RESOURCE_GPU: "1",
        contract.RESOURCE_GPU_MEMORY: "100",
        contract.RESOURCE_GPU_COMPUTE: "10",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"m{i}", "annotations": ann},
        "spec": {
            "nodeName": name,
            "schedulerName": contract.SCHEDULER_NAME,
            "tolerations": [contract.gpu_node_toleration()],
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": limits},
                }
            ],
        },
    }


def memory_phase(c: Cluster, n_pods: int) -> Memory:
    """`n_pods` running GPU pods on the nodes (created bound, as after a day of scheduling), and the RSS of
    every component once its watches hold them all (two samples 15 s apart within 1 %)."""
    ns = f"memory-{secrets.token_hex(2)}"
    namespace(c.cp, ns)
    nodes = [n for n in c.nodes if json.loads(n["metadata"]["annotations"][contract.ANN_NODE_GPUS])]
    # at most 7 pods per GPU index cycle on a node: spread over the nodes first
    pods = [bound_pod(i, nodes[i % len(nodes)]) for i in range(n_pods)]
    with schedulers(c, "tessera") as s:
        pids = c.pids() | {k: p.popen.pid for k, p in s.procs.items()}
        t0 = time.monotonic()
        replay = asyncio.run(_create_only(c, ns, pods))
        say(
            f"memory: {len(replay.created)} pods created in {time.monotonic() - t0:.0f} s; waiting for RSS to settle"
        )
        last: dict[str, float] = {}
        for _ in range(40):
            now = {k: rss_mib(p) for k, p in pids.items()}
            if last and all(abs(now[k] - last[k]) <= 0.01 * max(last[k], 1.0) for k in now):
                break
            last = now
            time.sleep(15)
        took = time.monotonic() - t0
        rss = {k: rss_mib(p) for k, p in pids.items()}
    row = Memory(len(c.nodes), len(replay.created), took, rss)
    MEMORY.append(row)
    say("memory: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()))
    # Not cleared: the last step at this node count, and the control plane goes with its pods (a delete of
    # 40,000 pods takes the API server minutes).
    return row


async def _create_only(c: Cluster, ns: str, pods: list[dict[str, Any]]) -> Replay:
    replay = Replay()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ctx = ssl.create_default_context(cafile=str(c.cp.ca_file))
    async with aiohttp.ClientSession(
        c.cp.server, headers=headers, connector=aiohttp.TCPConnector(ssl=ctx, limit=64)
    ) as session:
        sem = asyncio.Semaphore(48)

        async def create(pod: dict[str, Any]) -> None:
            async with sem:
                error = await post_pod(session, ns, pod, replay)
                if error is not None:
                    raise RuntimeError(f"creating {pod['metadata']['name']}: {error}")
                if len(replay.created) % 2000 == 0:
                    say(f"  {len(replay.created)}/{len(pods)} created")

        await asyncio.gather(*(create(p) for p in pods))
    return replay


# --- the report ----------------------------------------------------------------------------------------------


def _s(v: float | None, unit: str = "s", digits: int = 3) -> str:
    if v is None:
        return "–"
    if unit == "ms":
        return f"{1000 * v:.0f} ms" if v >= 0.01 else f"{1000 * v:.1f} ms"
    return f"{v:.{digits}f} {unit}".rstrip()


def report_memory(rows: list[Memory]) -> None:
    names = ("extender", "operator", "kube-scheduler", "kube-apiserver", "etcd", "kwok")
    print("\n## Memory with every pod running (RSS once the watches hold them)\n")
    print("| nodes | running pods | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for m in rows:
        print(
            f"| {m.nodes} | {m.pods} | "
            + " | ".join(f"{m.rss[k]:.0f} MiB" if k in m.rss else "–" for k in names)
            + " |"
        )


def report(results: list[Result]) -> None:
    print("\n## Throughput and latency (pods bound per second; creation → bound)\n")
    print(
        "| nodes | config | pods | bound | pods/s with a backlog | pods/s overall | latency p50 / p99 (client) "
        "| SLI p50 / p99 (kube-scheduler) | attempt p50 / p99 | unallocated GPUs |"
    )
    print("|---:|---|---:|---:|---:|---:|---|---|---|---:|")
    for r in results:
        lat = r.replay.latencies()
        sus = r.replay.sustained()
        print(
            f"| {r.nodes} | {r.config} | {r.created} | {len(r.replay.bound)} | "
            f"{'kept up' if sus is None else f'{sus:.1f}'} | {r.replay.overall():.1f} | "
            f"{_s(percentile(lat, 0.5))} / {_s(percentile(lat, 0.99))} | "
            f"{_s(quantile(0.5, r.sli))} / {_s(quantile(0.99, r.sli))} | "
            f"{_s(quantile(0.5, r.attempt), 'ms')} / {_s(quantile(0.99, r.attempt), 'ms')} | "
            f"{'–' if r.unallocated is None else f'{r.unallocated:.1f} %'} |"
        )
    ext = [r for r in results if r.extender]
    if ext:
        print("\n## The extender's calls as its server timed them (p50 / p99, calls)\n")
        print("| nodes | filter | prioritize | bind |")
        print("|---:|---|---|---|")
        for r in ext:
            cells = [
                f"{_s(quantile(0.5, h), 'ms')} / {_s(quantile(0.99, h), 'ms')} ({total(h):.0f})"
                for h in (r.extender.get(v, {}) for v in ("filter", "prioritize", "bind"))
            ]
            print(f"| {r.nodes} | " + " | ".join(cells) + " |")
    print("\n## CPU seconds / peak RSS during each replay\n")
    names = ("kube-scheduler", "extender", "operator", "kube-apiserver", "etcd", "kwok")
    print("| nodes | config | replay | " + " | ".join(names) + " |")
    print("|---:|---|---:|" + "---|" * len(names))
    for r in results:
        cells = [
            f"{r.usage.cpu[k]:.0f} s / {r.usage.peak[k]:.0f} MiB" if k in r.usage.cpu else "–" for k in names
        ]
        print(f"| {r.nodes} | {r.config} | {r.took:.0f} s | " + " | ".join(cells) + " |")
    print("\n## Against the baseline (kube-scheduler alone) at the same node count\n")
    print("| nodes | config | p99 latency / baseline | throughput / baseline |")
    print("|---:|---|---:|---:|")
    for r in results:
        base = next((b for b in results if b.nodes == r.nodes and b.config == "kube-scheduler"), None)
        if base is None or r is base:
            continue
        p99, bp99 = percentile(r.replay.latencies(), 0.99), percentile(base.replay.latencies(), 0.99)
        thr, bthr = _throughput(r), _throughput(base)
        print(f"| {r.nodes} | {r.config} | {_ratio(p99, bp99)} | {_ratio(thr, bthr)} |")
    sizes = sorted({r.nodes for r in results})
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        print(f"\n## Growth from {lo} to {hi} nodes ({hi / lo:.0f}x)\n")
        print(
            "| config | p99 latency | throughput | kube-scheduler CPU | extender peak RSS | operator peak RSS |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for config in dict.fromkeys(r.config for r in results):
            a = next((r for r in results if r.config == config and r.nodes == lo), None)
            b = next((r for r in results if r.config == config and r.nodes == hi), None)
            if a is None or b is None:
                continue
            print(
                f"| {config} | {_ratio(percentile(b.replay.latencies(), 0.99), percentile(a.replay.latencies(), 0.99))} "
                f"| {_ratio(_throughput(b), _throughput(a))} "
                f"| {_ratio(b.usage.cpu.get('kube-scheduler'), a.usage.cpu.get('kube-scheduler'))} "
                f"| {_ratio(b.usage.peak.get('extender'), a.usage.peak.get('extender'))} "
                f"| {_ratio(b.usage.peak.get('operator'), a.usage.peak.get('operator'))} |"
            )


def _throughput(r: Result) -> float:
    sus = r.replay.sustained()
    return sus if sus is not None else r.replay.overall()


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "–"


def main() -> None:
    global LOGS, QUIET_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", default="1000,5000", help="node counts, comma-separated")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"any of {', '.join(CONFIGS)}")
    ap.add_argument("--rate", type=float, default=100.0, help="pods created per second")
    ap.add_argument("--max-pods", type=int, default=6000, help="at most this many pods per replay")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stretch", type=float, default=1.0, help="multiplies the trace's pod durations")
    ap.add_argument("--no-operator", action="store_true", help="do not run the operator beside")
    ap.add_argument(
        "--controller-qps",
        type=int,
        default=0,
        help="kube-controller-manager's --kube-api-qps (burst twice it); 0 keeps its default of 20",
    )
    ap.add_argument(
        "--quiet",
        type=float,
        default=QUIET_S,
        help="a replay ends once nothing was bound for this many seconds after the last create",
    )
    ap.add_argument(
        "--memory-pods",
        type=int,
        default=0,
        help="then this many running pods at once, for every component's RSS",
    )
    ap.add_argument("--logs", type=Path, help="keep each replay's kube-scheduler and extender logs here")
    args = ap.parse_args()
    LOGS = args.logs
    QUIET_S = args.quiet
    configs = [c for c in args.configs.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configs {sorted(unknown)}; expected some of {', '.join(CONFIGS)}")
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so the control plane and kwok are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = RESULTS
    memory = MEMORY
    try:
        for n in (int(x) for x in args.nodes.split(",")):
            with cluster(n, not args.no_operator, args.controller_qps) as c:
                arrivals, full = workload(c.gpus, args.seed, args.max_pods, args.stretch)
                say(
                    f"{len(arrivals)} pods per replay ({'to' if full else 'short of'} the cluster's {c.gpus} GPUs)"
                )
                if "dra" in configs:
                    publish_slices(c.cp, c.nodes)
                for config in configs:
                    say(f"{n} nodes: {config}")
                    run_config(c, config, arrivals, full, args.rate)
                if args.memory_pods:
                    memory_phase(c, args.memory_pods)
    finally:  # what was measured before a failure is still reported
        report(results)
        if memory:
            report_memory(memory)


if __name__ == "__main__":
    main()
