"""Benchmark: one Themis arbiter round with 100–1000 Apps against a real API server, next to kmock.

    .venv/bin/python tests/bench/bench_arbiter_realcluster.py [--quick] [--sizes 100,300,1000]
        [--repeat 3] [--no-kmock] [--profile N] [--status-staleness S] [--no-events]

For each size N it starts a fresh control plane (tests/integration/k8s/controlplane.py: etcd,
kube-apiserver with RBAC, kube-controller-manager), applies the chart's CRDs and RBAC, creates N/16 Ready
8-GPU nodes (N/2 GPUs) and runs the real kopf operator in-process as the chart's operator ServiceAccount.
N Apps (one job, every third App two, 1–4 GPUs each: ~3.3 GPUs of demand per App on N/2 GPUs, heavy
contention) are created concurrently while it runs; once every App has a status and the operator is quiet
(no round, no pending event, every planned pod in its watch), the lease clock moves past every lease and
the round the operator's own App timer then starts is measured: every GPU is re-auctioned, losers' pods
are deleted, winners' created, every App's status written. That is repeated (--repeat, after the operator
settles again) and the median round reported with the spread: the machine is shared.

Per round: wall time as the operator exports it (`tessera_auction_duration_seconds`), the auction
(`Themis.allocate`, timed in the round), API calls by verb with their summed latency and the wall time
with at least one request in flight (`KubeApi.counts`, `.seconds`, `.busy_seconds()`), the operator
ServiceAccount's requests as the API server's audit log has them, and the CPU seconds the operator,
kube-apiserver and etcd spent in it (a client that is busy on its own CPU keeps its requests in flight
too, so the in-flight share alone does not say who is slow). `--profile N` adds a cProfile of the
operator's process during the first round at size N.

The baseline is the same workload and round on kmock's in-process emulator (as bench_operator.py runs
it), side by side as a ratio. No scheduler runs: pods stay Pending (unbound pods are deleted at once), so
the round measures the operator and the API server, not binding. Goal: a round under 5 s at 1000 Apps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import io
import logging
import math
import os
import pstats
import ssl
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tessera.api import contract
from tessera.controller.concurrency import gather_limited
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import Controller, make_registry
from tessera.progress import Progress

from tests.bench.bench_operator import _trim_request_log
from tests.bench.scale_measure import cpu_seconds
from tests.integration.clock import ManualClock
from tests.integration.k8s.conftest import (
    RELEASE_NS,
    Credentials,
    Nodes,
    apply_chart_rbac,
    apply_crds,
    running_operator,
)
from tests.integration.k8s.controlplane import ADMIN_TOKEN, ControlPlane, control_plane, wait_until
from tests.integration.operator import conftest as kmock_env

NS = kmock_env.NS
LEASE_S = 600.0
TICK_S = 10.0  # App timers: with N staggered timers one fires every TICK_S/N s, so the round starts promptly
IDLE_S = 2.0  # CPU use at steady state is sampled over this long before the round
QUIET_S = 3.0  # steady state: no round and nothing in flight for this long
GOAL_S = 5.0
HIST = "tessera_auction_duration_seconds"  # observed by every arbiter round (controller/arbiter.py)
APPS_PATH = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL_APP}"


def app_jobs(i: int) -> list[dict[str, Any]]:
    jobs = [kmock_env.job("j1", iters=10_000 + 97 * i, gpus=1 + i % 4)]
    if i % 3 == 0:
        jobs.append(kmock_env.job("j2", iters=5_000 + 31 * i, gpus=1 + (i // 3) % 2))
    return jobs


def apps(n: int) -> list[dict[str, Any]]:
    """N Apps of `app_jobs`' shapes, named a0000…"""
    return [kmock_env.app_body(f"a{i:04d}", app_jobs(i)) for i in range(n)]


def n_nodes(n: int) -> int:
    return max(1, n // 16)  # 8 GPUs each: N/2 GPUs


@dataclass
class Round:
    backend: str
    n: int
    gpus: int
    setup_s: float = 0.0
    round_s: float = 0.0
    policy_s: float = 0.0
    granted: int = 0
    expired: int = 0
    calls: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    call_s: dict[tuple[str, str, str], float] = field(default_factory=dict)
    busy_s: float = 0.0
    events: int = 0
    status_writes: int = 0
    ledger_writes: int = 0  # the arbiter's renewal ledger (one write for the round's renewals)
    setup_throttled: int = 0  # kopf's requests the server throttled (HTTP 429) while the Apps arrived
    throttled: int = 0  # ... and in the round
    lease_apps: int = 0  # Apps whose leases changed (expired or granted): their status must be written
    renewed_apps: int = 0  # of those, Apps holding the same GPUs for the same jobs after: only expiry moved
    audited: Counter[str] = field(default_factory=Counter)  # the operator's requests the server logged
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds in the round: operator, servers
    idle_cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per second before the round
    profile: str = ""


class Throttled(logging.Filter):
    """kopf logs every request the API server throttles (HTTP 429, priority and fairness) before retrying
    it; 1000 Apps arriving at once make hundreds. Counted, not printed."""

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "APITooManyRequests" in record.getMessage():
            Throttled.count += 1
            return False
        return True


def quiet_logging() -> None:
    """Warnings only; kopf's, aiohttp's and asyncio's errors only, kopf's throttled requests counted."""
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("kopf", "aiohttp", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    logging.getLogger("kopf.objects").addFilter(Throttled())


# --- the measured round, the same on both backends ----------------------------------------------------


async def poll(check: Callable[[], Awaitable[bool] | bool], timeout: float, what: str, every: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)


def tracked(ctl: Controller) -> int:
    """Objects the operator holds a record of: Apps (the arbiter's), TrialGroups, ModelDeployments."""
    kinds = (ctl.arbiter, ctl.trialgroups, ctl.deployments)
    return sum(len(k.records) for k in kinds if k is not None)


async def steady(ctl: Controller) -> None:
    """No round for QUIET_S, no change pending, no event in flight, every planned App pod listed by the
    watch (pods of other owners, TrialGroups' and ModelDeployments', are not the arbiter's to plan)."""
    arbiter = ctl.arbiter
    assert arbiter is not None
    last = (-1, 0.0)

    def quiet() -> bool:
        nonlocal last
        planned = sum(len(r.pod_plans()) for r in arbiter.records.values() if not r.done)
        listed = sum(1 for p in ctl.view.pods.values() if contract.LABEL_APP in p.labels)
        busy = arbiter.dirty or arbiter.lock.locked() or ctl._tasks or listed != planned
        now = time.monotonic()
        if busy or arbiter.rounds != last[0]:
            last = (arbiter.rounds, now)
            return False
        return now - last[1] >= QUIET_S

    # planning every App's pods is the costly check: less often the more Apps (this process runs them)
    await poll(quiet, 600, "the operator to settle", max(0.1, len(arbiter.records) / 10_000))


@dataclass
class Server:
    """The real control plane's side of a round: its processes' CPU, and the operator ServiceAccount's
    requests from the API server's audit log (kopf's own included, which `KubeApi` does not see)."""

    cp: ControlPlane
    user: str

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self.cp.processes if p.name in ("kube-apiserver", "etcd")}

    def requests(self, offset: int) -> Counter[str]:
        out: Counter[str] = Counter()
        for e in self.cp.audit(self.user, offset):
            ref = e.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            out[f"{e['verb']} {ref.get('resource')}{sub}"] += 1
        return out


def cpu_now(servers: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of this process ("operator": the operator runs in it, beside the bench's own
    client) and of each of `servers` (name → pid)."""
    return {"operator": time.process_time()} | {k: cpu_seconds(pid) for k, pid in servers.items()}


def _held(arbiter: Any) -> dict[str, set[tuple[str, str]]]:
    """Each App's (job, GPU) pairs under lease, by the report's App id (namespace/name)."""
    return {f"{ns}/{name}": rec.lease_pairs() for (ns, name), rec in arbiter.records.items()}


async def measure_round(
    ctl: Controller,
    clock: ManualClock,
    row: Round,
    profile: bool,
    server: Server | None,
    timeout_s: float = 900.0,
) -> None:
    """Expire every lease and measure the round the operator's own App timer then starts (within
    `timeout_s`). `server`'s processes have their CPU time in the round reported next to the operator's."""
    arbiter, api = ctl.arbiter, ctl.api
    assert arbiter is not None and api is not None
    servers = server.pids if server is not None else {}
    samples = arbiter.metrics.registry.get_sample_value
    policy: list[float] = []
    allocate, run_round = arbiter.themis.allocate, arbiter.run_round
    profiler = cProfile.Profile() if profile else None
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    target = math.inf  # the measured round is the first one dated at or after the clock's move

    def timed_allocate(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return allocate(*args, **kwargs)
        finally:
            policy.append(time.perf_counter() - t)

    async def traced_round(now: float) -> Any:
        if now < target or done.done():
            return await run_round(now)
        policy.clear()
        calls0, secs0, busy0, writes0, ledger0 = (
            Counter(api.counts),
            dict(api.seconds),
            api.busy_seconds(),
            arbiter.status_writes,
            arbiter.ledger_writes,
        )
        hist0 = (samples(f"{HIST}_count") or 0.0, samples(f"{HIST}_sum") or 0.0)
        cpu0, throttled0 = cpu_now(servers), Throttled.count
        held0 = _held(arbiter)
        try:
            report = await run_round(now)
        finally:
            if profiler is not None:
                profiler.disable()
        cpu1 = cpu_now(servers)
        hist1 = (samples(f"{HIST}_count") or 0.0, samples(f"{HIST}_sum") or 0.0)
        assert hist1[0] == hist0[0] + 1, "a round observes the duration histogram once"
        row.round_s = hist1[1] - hist0[1]  # what the operator exports for this round
        calls = Counter(api.counts)
        calls.subtract(calls0)
        row.calls, row.busy_s = +calls, api.busy_seconds() - busy0
        row.call_s = {k: v - secs0.get(k, 0.0) for k, v in api.seconds.items() if v > secs0.get(k, 0.0)}
        row.cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
        row.status_writes = arbiter.status_writes - writes0
        row.ledger_writes = arbiter.ledger_writes - ledger0
        row.throttled = Throttled.count - throttled0
        row.policy_s = sum(policy)
        row.granted = sum(report.granted.values())
        row.expired = sum(report.expired.values())
        row.lease_apps = len(set(report.expired) | set(report.granted))
        held1 = _held(arbiter)
        row.renewed_apps = sum(
            1
            for k in set(report.expired) | set(report.granted)
            if held0.get(k) and held0.get(k) == held1.get(k)
        )
        done.set_result(None)
        return report

    # What the processes burn at steady state, before the round (watch keep-alives, controllers, timers).
    idle0, t_idle = cpu_now(servers), time.perf_counter()
    await asyncio.sleep(IDLE_S)
    idle1 = cpu_now(servers)
    row.idle_cpu = {k: (idle1[k] - idle0[k]) / (time.perf_counter() - t_idle) for k in idle0}
    arbiter.themis.allocate = timed_allocate  # type: ignore[method-assign]
    arbiter.run_round = traced_round  # type: ignore[method-assign]
    try:
        async with arbiter.lock:  # no round in between: the next one sees every lease expired
            events0 = api.counts[("", "events", "create")]
            audit0 = server.cp.audit_offset() if server is not None else 0
            target = clock.advance(LEASE_S + 1)
            if profiler is not None:
                profiler.enable()
        await asyncio.wait_for(done, timeout=timeout_s)
        await poll(lambda: not ctl._tasks, timeout_s / 3, "the round's events to be posted", 0.05)
    finally:
        arbiter.themis.allocate = allocate  # type: ignore[method-assign]
        arbiter.run_round = run_round  # type: ignore[method-assign]
    row.events = api.counts[("", "events", "create")] - events0
    if server is not None:
        row.audited = server.requests(audit0)
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(30)
        row.profile = out.getvalue()
        if dump := os.environ.get("TESSERA_BENCH_PROFILE_OUT"):
            profiler.dump_stats(dump)  # for pstats' callers view: python -m pstats FILE


async def measure_rounds(
    ctl: Controller,
    clock: ManualClock,
    base: Round,
    repeat: int,
    profile: bool,
    server: Server | None,
    settle: Callable[[Controller], Awaitable[None]] = steady,
    timeout_s: float = 900.0,
) -> list[Round]:
    """`repeat` rounds, each after the operator settled again (`settle`; the shared machine's load varies),
    each within `timeout_s`."""
    rows = []
    for i in range(repeat):
        if i:
            await settle(ctl)
        row = dataclasses.replace(base)
        await measure_round(ctl, clock, row, profile and i == 0, server, timeout_s)
        print(f"{row.backend} N={row.n}: round {i + 1}/{repeat} {row.round_s:.2f}s", file=sys.stderr)
        rows.append(row)
    return rows


async def populate(
    ctl: Controller,
    bodies: list[dict[str, Any]],
    nodes: int,
    create: Callable[[dict[str, Any]], Awaitable[None]],
    statused: Callable[[], Awaitable[int]],
    label: str,
    row: Round,
) -> None:
    """Create the objects (`bodies`, any of Tessera's kinds) concurrently once the operator lists the
    cluster's `nodes`, wait until each has the operator's status (`statused` counts those that do) and the
    operator settles; progress on stderr. The time until every status is there is the row's setup time."""
    n = len(bodies)
    throttled0 = Throttled.count
    await poll(lambda: len(ctl.view.nodes) == nodes, 120 + nodes / 20, "the operator to list the nodes", 0.1)
    t0 = time.perf_counter()
    made = 0
    with Progress(n, f"{label}: creating objects", enabled=True) as bar:

        async def one(body: dict[str, Any]) -> None:
            nonlocal made
            await create(body)
            made += 1
            bar.update(made, f"{made}/{n}")

        for res in await gather_limited((one(b) for b in bodies), 32):
            if isinstance(res, BaseException):
                raise res
    with Progress(n, f"{label}: statuses", enabled=True) as bar:

        async def all_statused() -> bool:
            if (seen := tracked(ctl)) < n:  # cheap: the operator has not seen them all yet
                bar.update(seen / 2, f"{seen}/{n} tracked")
                return False
            got = await statused()
            bar.update(n / 2 + got / 2, f"{got}/{n} with status")
            return got == n

        # a list of every object per poll: less often the more there are
        await poll(all_statused, 1800 + n * 0.5, "every object's status", max(1.0, n / 1000))
    row.setup_s = time.perf_counter() - t0
    row.setup_throttled = Throttled.count - throttled0
    with Progress(1, f"{label}: settling", enabled=True):
        await steady(ctl)


# --- backends -----------------------------------------------------------------------------------------


def prepare(cp: ControlPlane) -> dict[str, Credentials]:
    """CRDs, chart RBAC (component → credentials), the namespace NS with its default ServiceAccount (which
    pod admission needs)."""
    apply_crds(cp)
    creds = apply_chart_rbac(cp)
    status, body = cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert status == 201, body
    wait_until(
        lambda: cp.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount of {NS}",
    )
    return creds


def start_real(cp: ControlPlane, n: int) -> Credentials:
    """What `prepare` sets up, and N/16 Ready 8-GPU nodes; the operator's credentials."""
    creds = prepare(cp)
    nodes = Nodes(cp)
    for i in range(n_nodes(n)):
        nodes.add(f"n{i:03d}", 8)
    return creds["operator"]


def operator_settings(clock: ManualClock, extra: dict[str, Any]) -> dict[str, Any]:
    """OperatorConfig fields both backends run with (`extra`: what the command line changed)."""
    return {"lease_s": LEASE_S, "tick_s": TICK_S, "preemption_grace_s": 30, "clock": clock} | extra


async def measure_real(
    cp: ControlPlane, creds: Credentials, n: int, repeat: int, profile: bool, extra: dict[str, Any]
) -> list[Round]:
    row = Round("real", n, n_nodes(n) * 8)
    clock = ManualClock()
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=ctx)) as http,
        running_operator(cp, creds, **operator_settings(clock, extra)) as ctl,
    ):

        async def create(body: dict[str, Any]) -> None:
            for key in ("uid", "resourceVersion"):  # the server assigns them
                body["metadata"].pop(key, None)
            async with http.post(cp.server + APPS_PATH, json=body) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"creating App: HTTP {resp.status}: {(await resp.text())[:300]}")

        async def statused() -> int:
            async with http.get(cp.server + APPS_PATH) as resp:
                items = (await resp.json())["items"]
            return sum(1 for a in items if (a.get("status") or {}).get("phase"))

        await populate(ctl, apps(n), n_nodes(n), create, statused, f"N={n} real", row)
        server = Server(cp, f"system:serviceaccount:{RELEASE_NS}:{creds.service_account}")
        return await measure_rounds(ctl, clock, row, repeat, profile, server)


@contextlib.asynccontextmanager
async def kmock_server() -> AsyncIterator[kmock.KubernetesEmulator]:
    async with kmock.KubernetesEmulator() as k, kmock.Server(k):
        kmock_env.setup_api(k)
        yield k


@contextlib.asynccontextmanager
async def kmock_operator(k: kmock.KubernetesEmulator, settings: dict[str, Any]) -> AsyncIterator[Controller]:
    """The operator as kmock_env.running_operator starts it, given longer to stop: with 1000 Apps kopf
    takes more than that fixture's 15 s to wind down its timers against kmock. kmock serves no Queue kind
    and cannot list Namespaces: their watches are off, as in that fixture (else kopf's namespace watcher
    gives up on kmock's errors and stops the operator)."""
    config = OperatorConfig(standalone=True, **({"queues": False, "watch_namespaces": False} | settings))
    registry, ctl = make_registry(config, kopf.ConnectionInfo(server=str(k.url), insecure=True))
    stop = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(registry=registry, clusterwide=True, stop_flag=stop, standalone=True)
    )
    try:
        yield ctl
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=300)


async def measure_kmock(n: int, repeat: int, extra: dict[str, Any]) -> list[Round]:
    row = Round("kmock", n, n_nodes(n) * 8)
    clock = ManualClock()
    rows: list[Round] = []
    async with kmock_server() as k:
        for i in range(n_nodes(n)):
            kmock_env.add_node(k, f"n{i:03d}", 8)
        stop = asyncio.Event()
        # kmock matches each request against every one it served; nothing here reads that log.
        trimmer = asyncio.create_task(_trim_request_log(k, stop))
        try:
            async with kmock_operator(k, operator_settings(clock, extra)) as ctl:

                async def create(body: dict[str, Any]) -> None:
                    resp = await k.post(APPS_PATH, json=body)
                    resp.raise_for_status()

                async def statused() -> int:
                    apps = [o for (res, _, _), o in list(k.objects.items()) if res == kmock_env.APPS]
                    return sum(1 for a in apps if (dict(a).get("status") or {}).get("phase"))

                await populate(ctl, apps(n), n_nodes(n), create, statused, f"N={n} kmock", row)
                rows = await measure_rounds(ctl, clock, row, repeat, False, None)
        finally:
            stop.set()
            await trimmer
    return rows


# --- report -------------------------------------------------------------------------------------------


def _calls(calls: Counter[tuple[str, str, str]]) -> str:
    return ", ".join(
        f"{verb} {group + '/' if group else ''}{res} {c}" for (group, res, verb), c in sorted(calls.items())
    )


def median(rows: list[Round]) -> Round:
    return sorted(rows, key=lambda r: r.round_s)[(len(rows) - 1) // 2]


def report(rows: list[Round]) -> None:
    runs: dict[tuple[str, int], list[Round]] = {}
    for r in rows:
        runs.setdefault((r.backend, r.n), []).append(r)
    picked = {key: median(rs) for key, rs in runs.items()}  # details below are the median round's
    real = [r for (backend, _), r in picked.items() if backend == "real"]
    print()
    print(f"median of {max(len(rs) for rs in runs.values())} rounds per size (min-max in brackets)")
    print(
        f"{'apps':>5} {'GPUs':>5} {'setup s':>8} {'round s':>18} {'kmock s':>18} {'real/kmock':>10}"
        f" {'auction s':>9} {'API busy s':>10} {'API share':>9} {'API Σ s':>8} {'growth':>7}"
    )

    def spread(key: tuple[str, int]) -> str:
        if key not in runs:
            return "-"
        times = [r.round_s for r in runs[key]]
        return f"{picked[key].round_s:.2f} [{min(times):.2f}-{max(times):.2f}]"

    prev: Round | None = None
    for r in real:
        base = picked.get(("kmock", r.n))
        ratio = f"{r.round_s / base.round_s:>10.1f}" if base else f"{'-':>10}"
        growth = f"x{r.round_s / prev.round_s:.1f}" if prev else "-"
        print(
            f"{r.n:>5} {r.gpus:>5} {r.setup_s:>8.1f} {spread(('real', r.n)):>18} {spread(('kmock', r.n)):>18}"
            f" {ratio} {r.policy_s:>9.3f} {r.busy_s:>10.2f} {r.busy_s / r.round_s:>9.0%}"
            f" {sum(r.call_s.values()):>8.1f} {growth:>7}"
        )
        prev = r
    big = max(real, key=lambda r: r.n, default=None)
    if big is not None:
        verdict = "met" if big.round_s < GOAL_S else "MISSED"
        print(f"goal: round under {GOAL_S:.0f} s at {big.n} Apps: {big.round_s:.2f} s ({verdict})")
    print()
    print(
        "per round: leases expired/granted (GPUs), API calls by verb (the round's own; events run alongside)"
    )
    for r in picked.values():
        print(
            f"{r.backend:>5} {r.n:>5} Apps: expired {r.expired}, granted {r.granted};"
            f" {sum(r.calls.values())} calls ({_calls(r.calls)}); {r.events} events posted;"
            f" {r.status_writes} statuses written and {r.ledger_writes} ledger write(s); {r.lease_apps} Apps"
            f" with changed leases, {r.renewed_apps} of them renewed on the same GPUs (only their expiry moved:"
            f" in the ledger, not written); writes {r.status_writes + r.ledger_writes} <= changed"
            f" {r.lease_apps - r.renewed_apps} + 1:"
            f" {'yes' if r.status_writes + r.ledger_writes <= r.lease_apps - r.renewed_apps + 1 else 'NO'};"
            f" {r.throttled} requests throttled (429; {r.setup_throttled} while the Apps arrived)"
        )
    print()
    print("the operator ServiceAccount's requests in the round as the API server's audit log has them")
    print("(from the clock's move until the round's events are posted; kopf's own requests included)")
    for r in real:
        print(
            f"{r.n:>5} Apps: {sum(r.audited.values())} ({', '.join(f'{k} {c}' for k, c in sorted(r.audited.items()))})"
        )
    print()
    print("seconds in API calls by verb (summed latency; requests overlap, up to api_concurrency at once)")
    for r in real:
        parts = ", ".join(
            f"{verb} {res} {s:.2f}s ({s / max(1, r.calls[(g, res, verb)]) * 1000:.0f} ms/call)"
            for (g, res, verb), s in sorted(r.call_s.items())
        )
        print(f"{r.n:>5} Apps: {parts}")
    print()
    print("CPU seconds during the round (a client busy on its own CPU also keeps its requests in flight)")
    for r in picked.values():
        parts = ", ".join(
            f"{k} {v:.1f}s ({v / r.round_s:.0%} of the round; {r.idle_cpu.get(k, 0):.0%} of a core before it)"
            for k, v in r.cpu.items()
        )
        print(f"{r.backend:>5} {r.n:>5} Apps: {parts}")
    for r in rows:
        if r.profile:
            print(f"\ncProfile of the first round at {r.n} Apps (real API server):")
            print(r.profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 Apps only")
    parser.add_argument("--sizes", default=None, help="comma-separated App counts (default 100,300,1000)")
    parser.add_argument("--no-kmock", action="store_true", help="skip the kmock baseline")
    parser.add_argument("--profile", type=int, default=None, metavar="N", help="cProfile the real round at N")
    parser.add_argument(
        "--status-staleness",
        type=float,
        default=None,
        metavar="S",
        help="the operator's status_max_staleness_s (default: one lease period; statuses due only to"
        " age are refreshed between rounds, a tick's share at a time)",
    )
    parser.add_argument("--no-events", action="store_true", help="the operator posts no events")
    parser.add_argument("--repeat", type=int, default=3, help="rounds measured per size (default 3)")
    args = parser.parse_args()
    extra: dict[str, Any] = {}
    if args.status_staleness is not None:
        extra["status_max_staleness_s"] = args.status_staleness
    if args.no_events:
        extra["post_events"] = False
    sizes = [100] if args.quick else [int(s) for s in (args.sizes or "100,300,1000").split(",")]
    quiet_logging()
    rows: list[Round] = []
    for n in sizes:
        print(f"N={n}: starting a control plane", file=sys.stderr)
        with control_plane() as cp:
            creds = start_real(cp, n)
            rows += asyncio.run(measure_real(cp, creds, n, args.repeat, args.profile == n, extra))
        if not args.no_kmock:
            rows += asyncio.run(measure_kmock(n, args.repeat, extra))
    report(rows)


if __name__ == "__main__":
    main()
