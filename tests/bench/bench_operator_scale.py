"""Benchmark: the operator at the scale users run — Apps, TrialGroups and ModelDeployments on thousands of
kwok GPU nodes, on the real control plane: the time until every object has its status, the arbiter's round
(its time, its writes), and the operator's memory.

    .venv/bin/python tests/bench/bench_operator_scale.py [--nodes 1000,5000] [--apps 1000,5000]
        [--repeat 3] [--quick] [--no-scheduler]

`--nodes` and `--apps` pair by position (default 1,000 nodes with 1,000 Apps, then 5,000 with 5,000);
`--quick` is one smoke size, 200 nodes with 200 Apps. Each size runs in a child process of its own (this
file again, with `--one`), so the operator's memory at one size starts from a fresh interpreter and not
from what the previous size left in the allocator; a size that fails is reported and the next one runs.

The cluster, per size (tests/integration/kwok/harness.py, as tests/bench/bench_scale.py builds it): a
fresh control plane (etcd, kube-apiserver with its audit log, kube-controller-manager; kwok's
`WatchList=false`), the chart's CRDs and RBAC, kwok playing that many GPU nodes of Alibaba's node list
(tiled past its 1,213 nodes; their GPU models and memory as the trace has them, 10 lanes a GPU as
bench_scale declares them, every node carrying the agent's `gpuNodes.reserve` taint), and
tessera-scheduler (kube-scheduler with the extender, as the chart configures it, the one-pod-at-a-time
handoff on, as the chart's `scheduler` ServiceAccount). The operator's pods are bound through the extender
and kwok runs them: it marks each `tessera.io/allocated` as the agent's Allocate would, then Running; they
never end (no run time given). The operator runs in this process as the chart's `operator` ServiceAccount
(tests/integration/k8s/conftest.py `running_operator`) with the chart's lease period (600 s) and its
default tick (a tenth of it), on a ManualClock, so the bench decides when every lease expires.

The workload, per size of N Apps, created at once (32 requests in flight) in one namespace, interleaved:
N Apps of bench_arbiter_realcluster's shapes (one job, every third App two, 1–4 GPUs each, ~3.3 GPUs of
demand an App), N/10 TrialGroups (four trials, two GPUs, Fluid packing two trials a GPU) and N/20
ModelDeployments (a static model with a measured latency per batch size, one or two replicas on 4096 MiB /
50 % lanes). Every body is checked with the API's validators first. Together they ask ~3.3 N GPUs (Apps)
+ 0.2 N (TrialGroup pools) + ~0.08 N lanes against the ~5.3 N GPUs of N trace nodes: the cluster is not
contended, as one sized for its users is not. ModelDeployments' gateways are not run: the operator reads
no gateway (`serving_stats_interval_s` 0) and the gateway Deployments' pods stay Pending (no default
scheduler runs); their workers run on lanes like every other pod.

Measured per size:
- arrival: the time from the first create until every object has the operator's status (an App its
  phase, a TrialGroup and a ModelDeployment their Ready condition; the first rounds and passes after
  arrival), and the time until every GPU pod the operator made is bound and Running (kwok), or how many
  were once none had started for two minutes;
- the App round, --repeat times (median, [min–max]), each once the previous round's pods were bound and
  Running (waited for up to a lease period: the next round comes then whatever the scheduler got done;
  the report says how many were) and the operator settled (no round, no event in flight, every planned
  App pod listed), and the ManualClock moved past every lease, so the round the operator's own App timer
  then starts re-auctions every GPU. bench_arbiter_realcluster's `measure_round`: its wall time as the
  operator exports it
  (`tessera_auction_duration_seconds`), its writes (status patches + ledger writes against the Apps whose
  lease changed other than by a renewal on the same GPUs, + 1), the operator ServiceAccount's requests as
  the API server's audit log has them (kopf's own and any TrialGroup and ModelDeployment status patches
  that fell in the round included), and the CPU seconds in the round of this process (the operator, with
  the bench's client), kube-apiserver, etcd, kube-scheduler, the extender and kwok;
- between rounds, over one tick period (every App, TrialGroup and ModelDeployment timer fires once): the
  TrialGroup and ModelDeployment passes (count, mean and longest, each including its wait for the kind's
  lock), the operator's requests in the audit log (their status patches among them) and the CPU seconds;
- memory: this process's RSS before the operator started, after every object arrived and the pods ran,
  and after the rounds, and its peak (`getrusage` ru_maxrss), as growth over the RSS before the operator
  started. That is the process's RSS, the bench's own client included (its lists of every object while
  it waits for statuses, its request bodies), not the operator's alone; the operator deployed runs alone
  in its process. RSS now and peak (VmHWM) of kube-apiserver, etcd, kube-scheduler, the extender and kwok.

A markdown table closes the report, one row per size, with the growth from the smallest to the largest.
The machine is shared: wall times say how much of the cores the round got; CPU seconds and request counts
are the figures that compare across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import pickle
import resource
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.api import contract  # noqa: E402
from tessera.api.resources import manifest_errors  # noqa: E402
from tessera.controller.handlers import Controller  # noqa: E402
from tessera.controller.reconciler import KindReconciler  # noqa: E402
from tessera.progress import Progress  # noqa: E402

from tests.bench.bench_arbiter_realcluster import (  # noqa: E402
    LEASE_S,
    NS,
    Round,
    Server,
    app_jobs,
    cpu_now,
    measure_rounds,
    median,
    operator_settings,
    poll,
    populate,
    prepare,
    quiet_logging,
    steady,
)
from tests.bench.bench_scale import SLOTS  # noqa: E402
from tests.bench.scale_measure import rss_mib  # noqa: E402
from tests.integration.clock import ManualClock  # noqa: E402
from tests.integration.k8s.conftest import (  # noqa: E402
    RELEASE_NS,
    Credentials,
    Scheduling,
    run_scheduling,
    running_operator,
)
from tests.integration.k8s.controlplane import ADMIN_TOKEN, ControlPlane, Process  # noqa: E402
from tests.integration.kwok import harness as kwok  # noqa: E402
from tests.integration.operator import conftest as kmock_env  # noqa: E402

DEFAULT_SIZES = "1000:1000,5000:5000"
QUICK = (200, 200)
PLURALS = {
    contract.KIND_APP: contract.PLURAL_APP,
    contract.KIND_TRIALGROUP: contract.PLURAL_TRIALGROUP,
    contract.KIND_MODELDEPLOYMENT: contract.PLURAL_MODELDEPLOYMENT,
}
STALL_S = 120.0  # the wait for GPU pods to run gives up once none has started for this long
SERVERS = ("kube-apiserver", "etcd", "kube-scheduler", "extender", "kwok")


def say(msg: str) -> None:
    print(f"[bench_operator_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the workload --------------------------------------------------------------------------------------


def trialgroup(i: int) -> dict[str, Any]:
    """Four trials (one long, three short) on two GPUs, Fluid packing up to two trials a GPU."""
    trials = [
        kmock_env.trial("a", 600 + 7 * i, lr=0.1),
        *(kmock_env.trial(t, 100 + i % 50) for t in ("b", "c", "d")),
    ]
    return kmock_env.tg_body(f"tg{i:04d}", trials, gpus=2, fluid={"maxPackPerGPU": 2})


def modeldeployment(i: int) -> dict[str, Any]:
    """kmock_env's static model (one replica serves ~178 rps): 100 rps → one replica, 200 rps → two."""
    return kmock_env.md_body(f"md{i:04d}", rps=100.0 * (1 + i % 2))


def workload(n: int) -> list[dict[str, Any]]:
    """N Apps, N/10 TrialGroups, N/20 ModelDeployments, interleaved in creation order, each checked with
    the API's validators (a refused body would measure the operator's error path)."""
    kinds = [
        [kmock_env.app_body(f"a{i:05d}", app_jobs(i)) for i in range(n)],
        [trialgroup(i) for i in range(n // 10)],
        [modeldeployment(i) for i in range(n // 20)],
    ]
    mixed = sorted(
        ((i / len(bodies), k, body) for k, bodies in enumerate(kinds) for i, body in enumerate(bodies)),
        key=lambda t: (t[0], t[1]),
    )
    out = []
    for _, _, body in mixed:
        for key in ("uid", "resourceVersion"):  # kmock_env's bodies carry them; the server assigns them
            body["metadata"].pop(key, None)
        if errors := manifest_errors(body):
            raise SystemExit(f"{body['kind']} {body['metadata']['name']} is invalid: {errors}")
        out.append(body)
    return out


def has_status(kind: str, obj: dict[str, Any]) -> bool:
    """An App has its phase; a TrialGroup or ModelDeployment its Ready condition."""
    status = obj.get("status") or {}
    if kind == contract.KIND_APP:
        return bool(status.get("phase"))
    return any(c.get("type") == "Ready" for c in status.get("conditions") or [])


def refused(obj: dict[str, Any]) -> str | None:
    """Why the operator refused the object (its Valid condition False), else None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Valid" and c.get("status") == "False":
            return str(c.get("message"))
    return None


# --- what is measured beside the round ---------------------------------------------------------------


@dataclass
class Window:
    """One tick period between rounds: every App, TrialGroup and ModelDeployment timer fires once."""

    seconds: float = 0.0
    passes: Counter[str] = field(default_factory=Counter)  # kind → TrialGroup/ModelDeployment passes
    pass_s: dict[str, float] = field(default_factory=dict)  # kind → seconds in them, summed
    pass_max: dict[str, float] = field(default_factory=dict)  # kind → the longest
    audited: Counter[str] = field(default_factory=Counter)  # the operator's requests (audit log)
    cpu: dict[str, float] = field(default_factory=dict)
    status_writes: int = 0  # App statuses the arbiter refreshed (due to age only)


@dataclass
class Row:
    nodes: int
    apps: int
    trialgroups: int
    deployments: int
    gpus: int
    nodes_s: float = 0.0  # kwok nodes created and Ready
    setup_s: float = 0.0  # first create → every object with its status
    pods: int = 0  # the operator's GPU pods once it settled after arrival
    running: int = 0  # of those, bound and Running
    running_s: float = 0.0  # first create → all of them Running (or the wait gave up)
    setup_throttled: int = 0
    rounds: list[Round] = field(default_factory=list)
    before_rounds: list[tuple[int, int]] = field(default_factory=list)  # GPU pods (Running, all) before each
    window: Window = field(default_factory=Window)
    rss_base: float = 0.0  # MiB, this process before the operator started
    rss_arrived: float = 0.0  # after every object arrived and its pods ran
    rss_rounds: float = 0.0  # after the measured rounds
    rss_peak: float = 0.0  # ru_maxrss
    servers_rss: dict[str, float] = field(default_factory=dict)  # after arrival
    servers_peak: dict[str, float] = field(default_factory=dict)  # VmHWM at the end
    error: str = ""
    scheduled: bool = True  # tessera-scheduler ran (False: --no-scheduler, the operator's pods stay Pending)


@dataclass
class Cluster(Server):
    """Server (kube-apiserver, etcd, the operator's audit log) and the processes kwok's cluster adds."""

    extra: dict[str, int] = field(default_factory=dict)

    @property
    def pids(self) -> dict[str, int]:
        return super().pids | self.extra


def self_rss() -> float:
    return rss_mib(os.getpid())


def self_peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def pending(ctl: Controller) -> tuple[int, int]:
    """Without a scheduler: (0, the operator's GPU pods), none of which can run."""
    return 0, sum(1 for p in ctl.view.pods.values() if p.gpu_indices and not p.deleting and not p.finished)


async def running(ctl: Controller, label: str, limit_s: float = math.inf) -> tuple[int, int]:
    """Wait until every GPU pod the operator made (a placement, not being deleted, not ended) is bound and
    Running, or none more has started for STALL_S, or `limit_s` passed; (running, all)."""
    t0 = last_change = time.monotonic()
    last = -1
    with Progress(1, f"{label}: pods running", enabled=True) as bar:
        while True:
            pods = [p for p in ctl.view.pods.values() if p.gpu_indices and not p.deleting and not p.finished]
            up = sum(1 for p in pods if p.bound and p.phase == "Running")
            bar.total = max(1, len(pods))
            bar.update(up, f"{up}/{len(pods)} bound and Running")
            now = time.monotonic()
            if up == len(pods):
                return up, len(pods)
            if up != last:
                last, last_change = up, now
            elif now - last_change > STALL_S or now - t0 > limit_s:
                why = (
                    f"{STALL_S:.0f} s without progress" if now - last_change > STALL_S else f"{limit_s:.0f} s"
                )
                say(f"{label}: {len(pods) - up} of {len(pods)} GPU pods not Running after {why}")
                return up, len(pods)
            await asyncio.sleep(1.0)


async def between_rounds(ctl: Controller, server: Cluster) -> Window:
    """Time every TrialGroup and ModelDeployment pass over one tick period, with the operator's requests
    and the CPU used meanwhile."""
    w = Window()
    kinds: dict[str, KindReconciler[Any]] = {}
    if ctl.trialgroups is not None:
        kinds[contract.KIND_TRIALGROUP] = ctl.trialgroups
    if ctl.deployments is not None:
        kinds[contract.KIND_MODELDEPLOYMENT] = ctl.deployments

    def timed(kind: str, rec: KindReconciler[Any]) -> Any:
        reconcile = rec.reconcile

        async def wrapped(body: dict[str, Any], patch: Any) -> str | None:
            t = time.perf_counter()
            try:
                return await reconcile(body, patch)
            finally:
                took = time.perf_counter() - t
                w.passes[kind] += 1
                w.pass_s[kind] = w.pass_s.get(kind, 0.0) + took
                w.pass_max[kind] = max(w.pass_max.get(kind, 0.0), took)

        return wrapped

    arbiter = ctl.arbiter
    assert arbiter is not None
    for kind, rec in kinds.items():
        rec.reconcile = timed(kind, rec)  # type: ignore[method-assign]
    try:
        audit0, cpu0, writes0 = server.cp.audit_offset(), cpu_now(server.pids), arbiter.status_writes
        t0 = time.perf_counter()
        await asyncio.sleep(ctl.config.tick)
        w.seconds = time.perf_counter() - t0
        cpu1 = cpu_now(server.pids)
        w.cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
        w.status_writes = arbiter.status_writes - writes0
        w.audited = server.requests(audit0)
    finally:
        for rec in kinds.values():
            del rec.reconcile  # the class's method again
    return w


# --- one size ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def kwok_cluster(n_nodes: int) -> Iterator[tuple[ControlPlane, dict[str, Credentials], Process, int, float]]:
    """Control plane, chart CRDs and RBAC, the namespace, kwok and its Ready trace nodes; (cluster,
    credentials, kwok, GPUs, seconds the nodes took)."""
    with kwok.kwok_control_plane() as cp:
        creds = prepare(cp)
        proc = kwok.start_kwok(cp)
        bodies = kwok.trace_nodes(n_nodes, reserve=True, slots_per_gpu=SLOTS)
        gpus = sum(len(json.loads(b["metadata"]["annotations"][contract.ANN_NODE_GPUS])) for b in bodies)
        say(f"creating {n_nodes} kwok nodes ({gpus} GPUs)")
        t0 = time.monotonic()
        kwok.create_nodes(cp, bodies)
        took = time.monotonic() - t0
        say(f"{n_nodes} kwok nodes Ready in {took:.0f} s")
        del bodies
        yield cp, creds, proc, gpus, took


async def measure(
    cp: ControlPlane, creds: Credentials, sched: Scheduling | None, kwok_proc: Process, row: Row, repeat: int
) -> None:
    n = row.apps
    label = f"{row.nodes} nodes / {n} Apps"
    bodies = workload(n)
    row.trialgroups = sum(1 for b in bodies if b["kind"] == contract.KIND_TRIALGROUP)
    row.deployments = sum(1 for b in bodies if b["kind"] == contract.KIND_MODELDEPLOYMENT)
    server = Cluster(
        cp,
        f"system:serviceaccount:{RELEASE_NS}:{creds.service_account}",
        {"kwok": kwok_proc.popen.pid}
        | (
            {"kube-scheduler": sched.scheduler.popen.pid, "extender": sched.extender.popen.pid}
            if sched
            else {}
        ),
    )
    clock = ManualClock()
    # The chart's lease period and default tick (a tenth of it); no gateway is read.
    settings = operator_settings(clock, {"tick_s": None, "serving_stats_interval_s": 0})
    assert settings["lease_s"] == LEASE_S
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = f"{cp.server}/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}"
    row.rss_base = self_rss()
    async with (
        aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=ctx)) as http,
        running_operator(cp, creds, stop_timeout=120 + n / 10, **settings) as ctl,
    ):
        # kopf has installed its signal handlers once its watches list the nodes: ours replace them
        await poll(lambda: len(ctl.view.nodes) == row.nodes, 120 + row.nodes / 20, "the node listing", 0.1)
        task = asyncio.current_task()
        assert task is not None
        _cancel_on_signal(task)

        async def create(body: dict[str, Any]) -> None:
            async with http.post(f"{base}/{PLURALS[body['kind']]}", json=body) as resp:
                if resp.status != 201:
                    raise RuntimeError(
                        f"creating {body['kind']}: HTTP {resp.status}: {(await resp.text())[:300]}"
                    )

        async def statused() -> int:
            got = 0
            for kind, plural in PLURALS.items():
                async with http.get(f"{base}/{plural}?resourceVersion=0") as resp:
                    items = (await resp.json())["items"]
                for obj in items:
                    if why := refused(obj):
                        raise RuntimeError(f"{kind} {obj['metadata']['name']} refused: {why}")
                got += sum(1 for obj in items if has_status(kind, obj))
            return got

        t0 = time.perf_counter()
        base_round = Round("kwok", n, row.gpus)
        await populate(ctl, bodies, row.nodes, create, statused, label, base_round)
        row.setup_s, row.setup_throttled = base_round.setup_s, base_round.setup_throttled
        del bodies
        say(f"{label}: every object has its status after {row.setup_s:.1f} s")
        row.running, row.pods = await running(ctl, label) if sched else pending(ctl)
        row.running_s = time.perf_counter() - t0
        say(f"{label}: {row.running}/{row.pods} GPU pods Running after {row.running_s:.1f} s")
        await steady(ctl)
        row.rss_arrived = self_rss()
        row.servers_rss = {k: rss_mib(pid) for k, pid in server.pids.items()}
        say(f"{label}: between rounds, one tick period ({ctl.config.tick:.0f} s)")
        row.window = await between_rounds(ctl, server)

        async def settle(c: Controller) -> None:
            """The previous round's pods bound and Running, for up to a lease period (the next round comes
            then whatever the scheduler got done), and the operator quiet."""
            row.before_rounds.append(await running(c, label, LEASE_S) if sched else pending(c))
            await steady(c)

        row.before_rounds.append((row.running, row.pods))
        await steady(ctl)
        # a round at 5,000 Apps moves thousands of pods on a shared machine: 900 s plus a second an App
        row.rounds = await measure_rounds(ctl, clock, base_round, repeat, False, server, settle, 900 + n)
        row.rss_rounds = self_rss()
        row.rss_peak = self_peak()
        row.servers_peak = {k: rss_mib(pid, "VmHWM") for k, pid in server.pids.items()}
        say(f"{label}: done; stopping the operator")


# --- signals: the child tears its cluster down on SIGTERM or SIGINT ------------------------------------

STOPPING = False  # a signal came: the child is unwinding, and ignores any further one


def _stop_on_signal() -> None:
    """Outside the event loop: SIGTERM and SIGINT unwind (the cluster is torn down); a second one during the
    teardown is ignored, so it cannot cut the teardown short and leave a process behind."""

    def handler(signum: int, _: Any) -> None:
        global STOPPING
        STOPPING = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(143)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _cancel_on_signal(task: asyncio.Task[Any]) -> None:
    """Inside the event loop, once kopf runs: a signal cancels `task` (the measurement), which stops the
    operator through its stop flag and unwinds. kopf installs handlers of its own for both signals when it
    starts (these replace them): they stop the operator on a signal and, since that stop did not come
    through the stop flag, SIGKILL the process shortly after, before any teardown ran."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        global STOPPING
        STOPPING = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: None)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


def run_one(n_nodes: int, n_apps: int, repeat: int, scheduled: bool = True) -> Row:
    with kwok_cluster(n_nodes) as (cp, creds, kwok_proc, gpus, nodes_s):
        row = Row(n_nodes, n_apps, 0, 0, gpus, nodes_s=nodes_s, scheduled=scheduled)
        try:
            with run_scheduling(cp, creds["scheduler"]) if scheduled else contextlib.nullcontext() as sched:
                try:
                    asyncio.run(measure(cp, creds["operator"], sched, kwok_proc, row, repeat))
                finally:  # closing its loop put the default handlers back
                    if STOPPING:
                        signal.signal(signal.SIGTERM, signal.SIG_IGN)
                        signal.signal(signal.SIGINT, signal.SIG_IGN)
                    else:
                        _stop_on_signal()
        except Exception as err:  # what was measured before is still reported
            row.error = f"{type(err).__name__}: {err}"[:2000]
            say(f"FAILED: {row.error}")
        finally:
            say("tearing the cluster down")
    return row


# --- the report ----------------------------------------------------------------------------------------


def _spread(rows: list[Round]) -> str:
    if not rows:
        return "–"
    times = [r.round_s for r in rows]
    return f"{median(rows).round_s:.2f} s [{min(times):.2f}–{max(times):.2f}]"


def _audit(c: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def _writes(r: Round) -> str:
    changed = r.lease_apps - r.renewed_apps
    ok = "yes" if r.status_writes + r.ledger_writes <= changed + 1 else "NO"
    return f"{r.status_writes} + {r.ledger_writes} ≤ {changed} + 1: {ok}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "–"


def report(rows: list[Row]) -> None:
    ok = [r for r in rows if r.rounds]
    for r in rows:
        if r.error:
            print(f"\n{r.nodes} nodes / {r.apps} Apps FAILED: {r.error}")
    if not ok:
        print("\nno size was measured")
        return
    print(f"\n## The operator at scale (median of {max(len(r.rounds) for r in ok)} rounds [min–max])\n")
    print(
        "| nodes | GPUs | Apps / TrialGroups / ModelDeployments | statuses after | pods Running | round "
        "| writes: statuses + ledger ≤ changed + 1 | requests in the round (audit log) "
        "| CPU in the round: operator / kube-apiserver / etcd | operator RSS: before, +arrived, +after rounds, +peak "
        "| kube-apiserver / etcd RSS |"
    )
    print("|---:|---:|---|---:|---:|---:|---|---:|---|---|---|")
    for r in ok:
        m = median(r.rounds)
        cpu = " / ".join(f"{m.cpu.get(k, 0):.1f}" for k in ("operator", "kube-apiserver", "etcd"))
        rss = (
            f"{r.rss_base:.0f} MiB, +{r.rss_arrived - r.rss_base:.0f}, +{r.rss_rounds - r.rss_base:.0f},"
            f" +{r.rss_peak - r.rss_base:.0f}"
        )
        print(
            f"| {r.nodes} | {r.gpus} | {r.apps} / {r.trialgroups} / {r.deployments} | {r.setup_s:.0f} s "
            f"| {r.running}/{r.pods} after {r.running_s:.0f} s | {_spread(r.rounds)} | {_writes(m)} "
            f"| {sum(m.audited.values())} | {cpu} s | {rss} "
            f"| {r.servers_rss.get('kube-apiserver', 0):.0f} / {r.servers_rss.get('etcd', 0):.0f} MiB |"
        )
    print("\nThe median round in detail:")
    for r in ok:
        m = median(r.rounds)
        print(
            f"- {r.nodes} nodes / {r.apps} Apps: leases expired {m.expired}, granted {m.granted} GPUs;"
            f" {m.lease_apps} Apps' leases changed, {m.renewed_apps} of them renewed on the same GPUs;"
            f" auction {m.policy_s:.2f} s; {m.events} events; {m.throttled} requests throttled (429;"
            f" {r.setup_throttled} while the objects arrived); audit log: {_audit(m.audited)};"
            f" CPU s: {', '.join(f'{k} {v:.1f}' for k, v in m.cpu.items())};"
            f" idle before it (share of a core): {', '.join(f'{k} {v:.0%}' for k, v in m.idle_cpu.items())}"
        )
    print("\nEach round (pods moved: the audit log's pod creates / deletes in the round):")
    for r in ok:
        for i, m in enumerate(r.rounds):
            up, pods = r.before_rounds[i] if i < len(r.before_rounds) else (0, 0)
            print(
                f"- {r.nodes} nodes / {r.apps} Apps, round {i + 1}: {m.round_s:.2f} s; {up}/{pods} GPU pods Running"
                f" before it; leases of {m.lease_apps} Apps changed, {m.renewed_apps} renewed on the same GPUs;"
                f" {m.status_writes} statuses + {m.ledger_writes} ledger written;"
                f" pods created {m.audited['create pods']}, deleted {m.audited['delete pods']}"
            )
    print("\n## Between rounds: one tick period (every timer fires once)\n")
    print(
        "| nodes | Apps | tick | TrialGroup passes (mean / longest) | ModelDeployment passes (mean / longest) "
        "| App statuses refreshed | operator requests (audit log) | CPU: operator / kube-apiserver / etcd |"
    )
    print("|---:|---:|---:|---|---|---:|---|---|")
    for r in ok:
        w = r.window

        def passes(kind: str, w: Window = w) -> str:
            n = w.passes[kind]
            if not n:
                return "0"
            return f"{n} ({1000 * w.pass_s[kind] / n:.0f} ms / {1000 * w.pass_max[kind]:.0f} ms)"

        cpu = " / ".join(f"{w.cpu.get(k, 0):.1f}" for k in ("operator", "kube-apiserver", "etcd"))
        print(
            f"| {r.nodes} | {r.apps} | {w.seconds:.0f} s | {passes(contract.KIND_TRIALGROUP)} "
            f"| {passes(contract.KIND_MODELDEPLOYMENT)} | {w.status_writes} | {sum(w.audited.values())}: "
            f"{_audit(w.audited)} | {cpu} s |"
        )
    print("\n## Memory (RSS after arrival / peak)\n")
    print("| nodes | Apps | operator process (with the bench client) | " + " | ".join(SERVERS) + " |")
    print("|---:|---:|---:|" + "---:|" * len(SERVERS))
    for r in ok:
        cells = [f"{r.servers_rss.get(k, 0):.0f} / {r.servers_peak.get(k, 0):.0f} MiB" for k in SERVERS]
        print(
            f"| {r.nodes} | {r.apps} | {r.rss_arrived:.0f} / {r.rss_peak:.0f} MiB "
            f"(+{r.rss_arrived - r.rss_base:.0f} / +{r.rss_peak - r.rss_base:.0f}) | "
            + " | ".join(cells)
            + " |"
        )
    if len(ok) > 1:
        lo, hi = ok[0], ok[-1]
        a, b = median(lo.rounds), median(hi.rounds)
        print(
            f"\n## Growth from {lo.nodes} nodes / {lo.apps} Apps to {hi.nodes} / {hi.apps} ({hi.apps / lo.apps:.0f}x)\n"
        )
        print(
            "| statuses after | round | statuses + ledger written | requests in the round "
            "| operator CPU in the round | operator RSS growth (arrived) | kube-apiserver RSS | etcd RSS |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(
            f"| {_ratio(hi.setup_s, lo.setup_s)} | {_ratio(b.round_s, a.round_s)} "
            f"| {_ratio(b.status_writes + b.ledger_writes, a.status_writes + a.ledger_writes)} "
            f"| {_ratio(sum(b.audited.values()), sum(a.audited.values()))} "
            f"| {_ratio(b.cpu.get('operator'), a.cpu.get('operator'))} "
            f"| {_ratio(hi.rss_arrived - hi.rss_base, lo.rss_arrived - lo.rss_base)} "
            f"| {_ratio(hi.servers_rss.get('kube-apiserver'), lo.servers_rss.get('kube-apiserver'))} "
            f"| {_ratio(hi.servers_rss.get('etcd'), lo.servers_rss.get('etcd'))} |"
        )


# --- main ----------------------------------------------------------------------------------------------


def _sizes(args: argparse.Namespace) -> list[tuple[int, int]]:
    if args.quick:
        return [QUICK]
    if args.nodes or args.apps:
        nodes = [int(x) for x in (args.nodes or args.apps).split(",")]
        apps = [int(x) for x in (args.apps or args.nodes).split(",")]
        if len(nodes) != len(apps):
            raise SystemExit("--nodes and --apps pair by position: give as many of each")
        return list(zip(nodes, apps, strict=True))
    return [(int(a), int(b)) for a, b in (s.split(":") for s in DEFAULT_SIZES.split(","))]


def child(n_nodes: int, n_apps: int, repeat: int, out: Path, scheduled: bool) -> None:
    _stop_on_signal()
    quiet_logging()
    try:
        row = run_one(n_nodes, n_apps, repeat, scheduled)
    except asyncio.CancelledError:  # a signal stopped the measurement; the cluster is torn down
        sys.exit(143)
    out.write_bytes(pickle.dumps(row))


def parent(sizes: list[tuple[int, int]], repeat: int, scheduled: bool) -> int:
    """Each size in a child process (this file with --one); the report of every size that returned."""
    rows: list[Row] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for n_nodes, n_apps in sizes:
            say(f"{n_nodes} nodes / {n_apps} Apps: starting a control plane")
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="bench-operator-scale-") as tmp:
                out = Path(tmp) / "row.pickle"
                argv = [sys.executable, __file__, "--one", f"{n_nodes}:{n_apps}", "--repeat", str(repeat),
                        "--out", str(out), *([] if scheduled else ["--no-scheduler"])]  # fmt: skip
                proc = subprocess.Popen(argv)
                try:
                    proc.wait()
                except KeyboardInterrupt:  # the child had the same SIGINT: it tears its cluster down
                    proc.wait()
                    raise
                finally:
                    if proc.poll() is None:  # this process was told to stop: so is the child, once
                        proc.terminate()
                        proc.wait()
                if out.exists():
                    rows.append(pickle.loads(out.read_bytes()))
                else:
                    rows.append(Row(n_nodes, n_apps, 0, 0, 0, error=f"the child exited {proc.returncode}"))
            say(f"{n_nodes} nodes / {n_apps} Apps: {time.monotonic() - t0:.0f} s in all")
    finally:
        report(rows)
    return 1 if any(r.error for r in rows) else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--nodes", help="kwok node counts, comma-separated (paired with --apps by position)")
    ap.add_argument(
        "--apps", help="App counts, comma-separated (TrialGroups a tenth, ModelDeployments a twentieth)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds measured per size (default 3)")
    ap.add_argument("--quick", action="store_true", help=f"one smoke size: {QUICK[0]} nodes, {QUICK[1]} Apps")
    ap.add_argument(
        "--no-scheduler",
        action="store_true",
        help="run no scheduler: the operator's pods stay Pending (the rounds measure the operator and the API "
        "server alone, as bench_arbiter_realcluster does)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # NODES:APPS, run in this process (the child)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        n_nodes, n_apps = (int(x) for x in args.one.split(":"))
        assert args.out is not None
        child(n_nodes, n_apps, args.repeat, args.out, not args.no_scheduler)
        return
    sys.exit(parent(_sizes(args), args.repeat, not args.no_scheduler))


if __name__ == "__main__":
    main()
