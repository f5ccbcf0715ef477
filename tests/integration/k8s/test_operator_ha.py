"""Restarts and two replicas of the operator on a real API server.

A restarted operator rebuilds its state from what the API server holds (leases in App status, pods), so it
keeps every lease as it was (node, GPUs, expiry) and creates no second pod; a lease renewed after its
status was last written is held until the expiry in the arbiter's renewal ledger. Two replicas peer through the
chart's ClusterKopfPeering: only the higher-priority one acts; when it dies without a word (SIGKILL: no
keep-alive, no farewell) the other waits out the dead peer's lifetime, takes over and allocates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from datetime import datetime
from typing import Any

import yaml
from tessera.api import contract
from tessera.controller.handlers import Controller

from .conftest import TESSERA, Credentials, ManualClock, Nodes, chart_objects, running_operator, wait_for
from .controlplane import ControlPlane, Process
from .workloads import operator, pods_with, status_of

log = logging.getLogger(__name__)
G, V = contract.GROUP, contract.VERSION
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "trainer:1"}]}}
LIFETIME = 10  # seconds a silent peer counts as alive (kopf's default is 60)


def app(name: str, jobs: dict[str, int]) -> dict[str, Any]:
    spec = [
        {"name": j, "iterTotal": 100000, "iterTimeSerialSeconds": 1.0, "maxGPUs": n} for j, n in jobs.items()
    ]
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": name},
        "spec": {"template": TEMPLATE, "jobs": spec},
    }


async def create(cluster: ControlPlane, ns: str, body: dict[str, Any]) -> None:
    status, out = await asyncio.to_thread(
        cluster.request, "POST", f"/apis/{G}/{V}/namespaces/{ns}/{contract.PLURAL_APP}", body
    )
    assert status == 201, out


def app_status(cluster: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return status_of(cluster, contract.PLURAL_APP, ns, name)


def app_pods(cluster: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    """The App's pods as the API server lists them, those being deleted left out."""
    return pods_with(cluster, ns, contract.LABEL_APP, name)


def pods_by_job(cluster: ControlPlane, ns: str, name: str) -> dict[str, list[str]]:
    """job → uids of its live pods."""
    out: dict[str, list[str]] = {}
    for p in app_pods(cluster, ns, name):
        out.setdefault(p["metadata"]["labels"][contract.LABEL_JOB], []).append(p["metadata"]["uid"])
    return out


def leased(st: dict[str, Any]) -> set[tuple[str, str, int]]:
    """(job, node, GPU index) of every lease in an App status."""
    return {(le["job"], le["node"], i) for le in st.get("leases") or [] for i in le["gpuIndices"]}


def settled(cluster: ControlPlane, ns: str, name: str, gpus: int) -> dict[str, Any] | None:
    """The App's status once it leases `gpus` GPUs and its live pods are exactly one per leased job and
    node, on the GPUs leased."""
    st = app_status(cluster, ns, name)
    if len(leased(st)) != gpus:
        return None
    want = sorted((le["job"], le["node"], sorted(le["gpuIndices"])) for le in st["leases"])
    have = []
    for p in app_pods(cluster, ns, name):
        where = json.loads(p["metadata"]["annotations"][contract.ANN_PLACEMENT])
        have.append((p["metadata"]["labels"][contract.LABEL_JOB], where["node"], sorted(where["gpuIndices"])))
    return st if sorted(have) == want else None


async def test_a_restart_keeps_every_lease_and_admission_and_creates_no_pod_twice(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    # Four GPUs: b arrives first and takes the three it wants, a gets the one left and wants another, so
    # a restarted operator that lost track of b's leases would hand one of them to a. The new operator
    # also runs with a tighter admission threshold (4 GPUs of demand on 4 GPUs; a and b ask for 5): it
    # applies to Apps that arrive from now on, not to a and b, admitted before.
    nodes.add(f"{namespace}-n1", gpus=4)
    clock = ManualClock()  # one clock for both runs: no lease expires across the restart
    creds = chart_rbac["operator"]
    async with running_operator(cluster, creds, clock=clock, lease_s=600.0):
        await create(cluster, namespace, app("b", {"j1": 2, "j2": 1}))
        await wait_for(lambda: settled(cluster, namespace, "b", 3), 90, "b on three GPUs")
        await create(cluster, namespace, app("a", {"j1": 2}))
        await wait_for(lambda: settled(cluster, namespace, "a", 1), 90, "a on the fourth")
        before = {n: app_status(cluster, namespace, n) for n in ("a", "b")}
        pods_before = {n: pods_by_job(cluster, namespace, n) for n in ("a", "b")}

    # The last operator deletes the test's objects before it stops: Apps left with their finalizer in a
    # terminating namespace would bid in the next test's auction (the operator serves every namespace).
    async with operator(
        cluster, creds, namespace, clock=clock, lease_s=600.0, admission_threshold=1.0
    ) as ctl:
        await wait_for(
            lambda: ctl.arbiter is not None and len(ctl.arbiter.records) == 2 and ctl.arbiter.rounds >= 1,
            90,
            "both Apps resumed and a round run",
        )
        # What kopf listed before any handler ran: every App's leases, whether loaded yet or not.
        claims = ctl.claims[contract.KIND_APP]
        assert {(namespace, "a"), (namespace, "b")} <= set(claims)
        await create(cluster, namespace, app("c", {"j1": 1}))
        refused = await wait_for(
            lambda: (st := app_status(cluster, namespace, "c")).get("conditions") and st, 60, "c refused"
        )
        ctl.arbiter.dirty = True  # one more full round with everything loaded
        rounds = ctl.arbiter.rounds
        await wait_for(lambda: ctl.arbiter is not None and ctl.arbiter.rounds > rounds, 60, "a round")
        after = {n: app_status(cluster, namespace, n) for n in ("a", "b")}
        pods_after = {n: pods_by_job(cluster, namespace, n) for n in ("a", "b")}
        c_pods = app_pods(cluster, namespace, "c")
    for n in ("a", "b"):
        # Same leases: job, node, GPU indices, expiry and source; still admitted.
        assert after[n]["leases"] == before[n]["leases"], n
        assert [c["status"] for c in after[n]["conditions"] if c["type"] == "Admitted"] == ["True"], n
        # The very same pods (uids), one per job, none deleted or made twice.
        assert pods_after[n] == pods_before[n], n
        assert all(len(uids) == 1 for uids in pods_after[n].values()), pods_after[n]
    assert [(c["type"], c["status"], c["reason"]) for c in refused["conditions"]] == [
        ("Admitted", "False", "OverThreshold"),
        ("Ready", "False", "NotAdmitted"),
    ]
    assert not c_pods


def trialgroup(name: str, gpus: int) -> dict[str, Any]:
    trials = [{"name": f"t{i}", "budgetIterations": 100000, "iterTimeSeconds": 1.0} for i in range(gpus)]
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": name},
        "spec": {"template": TEMPLATE, "trials": trials, "gpus": gpus},
    }


def pool_of(cluster: ControlPlane, ns: str, name: str) -> str | None:
    tg = cluster.get(f"/apis/{G}/{V}/namespaces/{ns}/{contract.PLURAL_TRIALGROUP}/{name}") or {}
    return ((tg.get("metadata") or {}).get("annotations") or {}).get(contract.ANN_GPU_POOL)


def tg_ready(cluster: ControlPlane, ns: str, name: str) -> bool:
    tg = cluster.get(f"/apis/{G}/{V}/namespaces/{ns}/{contract.PLURAL_TRIALGROUP}/{name}") or {}
    conditions = (tg.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pod_uids(cluster: ControlPlane, ns: str) -> dict[str, str]:
    got = cluster.get(f"/api/v1/namespaces/{ns}/pods") or {}
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in got.get("items") or []
        if not p["metadata"].get("deletionTimestamp")
    }


async def test_a_restart_keeps_a_trialgroups_pool_out_of_the_apps_auction(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    # The group's pool is half the node; the App wants the whole node and holds the other half. After a
    # restart the App's first round may run before the group's handler loaded its pool.
    nodes.add(f"{namespace}-n1", gpus=4)
    clock = ManualClock()
    creds = chart_rbac["operator"]
    async with running_operator(cluster, creds, clock=clock, lease_s=600.0):
        status, out = await asyncio.to_thread(
            cluster.request,
            "POST",
            f"/apis/{G}/{V}/namespaces/{namespace}/{contract.PLURAL_TRIALGROUP}",
            trialgroup("tg", 2),
        )
        assert status == 201, out
        pool = await wait_for(lambda: pool_of(cluster, namespace, "tg"), 90, "the group's pool")
        await create(cluster, namespace, app("a", {"j1": 2, "j2": 2}))
        before = await wait_for(lambda: settled(cluster, namespace, "a", 2), 90, "a on the other two GPUs")
        await wait_for(lambda: tg_ready(cluster, namespace, "tg"), 90, "the group's trial pods")
        pods_before = pod_uids(cluster, namespace)
    async with operator(cluster, creds, namespace, clock=clock, lease_s=600.0) as ctl:
        await wait_for(
            lambda: (
                ctl.arbiter is not None
                and len(ctl.arbiter.records) == 1
                and ctl.trialgroups is not None
                and ctl.trialgroups.reconciles >= 3
                and ctl.arbiter.rounds >= 1
            ),
            90,
            "the App and the group resumed",
        )
        ctl.arbiter.dirty = True
        rounds = ctl.arbiter.rounds
        await wait_for(lambda: ctl.arbiter is not None and ctl.arbiter.rounds > rounds, 60, "a round")
        after = app_status(cluster, namespace, "a")
        pods_after = pod_uids(cluster, namespace)
        pool_after = pool_of(cluster, namespace, "tg")
    assert after["leases"] == before["leases"]
    assert pool_after == pool
    assert pods_after == pods_before


# --- two replicas --------------------------------------------------------------------------------------

LOW = "tessera-standby"


def chart_peering(cluster: ControlPlane) -> str:
    """The chart's ClusterKopfPeering (default values: all namespaces), applied; its name."""
    (obj,) = [o for o in chart_objects() if o["kind"] == "ClusterKopfPeering"]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))
    return str(obj["metadata"]["name"])


def peers(cluster: ControlPlane, peering: str) -> dict[str, dict[str, Any]]:
    obj = cluster.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}") or {}
    return dict(obj.get("status") or {})


def spawn_operator(cluster: ControlPlane, creds: Credentials, peering: str, priority: int) -> Process:
    """`tessera operator` as its own process, as the chart runs it, with the operator's kubeconfig."""
    argv = ["env", f"KUBECONFIG={creds.kubeconfig}", str(TESSERA), "--log-level",
            "INFO", "operator", "--peering", peering, "--priority", str(priority), "--peering-lifetime-seconds",
            str(LIFETIME), "--lease-seconds", "600", "--metrics-port", "0", "--liveness", ""]  # fmt: skip
    return cluster.spawn(f"operator-{priority}-{os.getpid()}-{time.monotonic_ns()}", argv)


def kill(proc: Process) -> None:
    """SIGKILL: the process gets no chance to say goodbye (kopf would remove its peering record)."""
    os.killpg(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait(30)


def calls_of(ctl: Controller) -> set[tuple[str, str, str]]:
    return set(ctl.api.calls) if ctl.api is not None else set()


async def test_two_replicas_only_one_allocates_and_the_standby_takes_over_when_it_dies(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    peering = await asyncio.to_thread(chart_peering, cluster)
    nodes.add(f"{namespace}-n1", gpus=2)
    creds = chart_rbac["operator"]
    active = spawn_operator(cluster, creds, peering, priority=100)
    try:
        # The active replica announces itself first: kopf pauses a peer only once it has seen a
        # higher-priority record, so this is the order in which "only one acts" is guaranteed.
        active_id = await wait_for(
            lambda: next((p for p, v in peers(cluster, peering).items() if v.get("priority") == 100), None),
            90,
            "the active replica's keep-alive",
        )
        async with operator(
            cluster,
            creds,
            namespace,
            identity=LOW,
            standalone=False,
            peering_name=peering,
            priority=10,
            peering_lifetime_s=LIFETIME,
            lease_s=600.0,
            clock=time.time,  # the active replica's leases run on the wall clock too
        ) as standby:
            await wait_for(lambda: LOW in peers(cluster, peering), 60, "the standby's keep-alive")
            record = peers(cluster, peering)
            assert record[LOW]["lifetime"] == record[active_id]["lifetime"] == LIFETIME
            await create(cluster, namespace, app("a", {"j1": 1}))
            st_a = await wait_for(lambda: settled(cluster, namespace, "a", 1), 90, "a allocated")
            # The standby did nothing: its client sent no request and kopf ran none of its handlers.
            assert standby.arbiter is not None and not standby.arbiter.records
            assert calls_of(standby) == set()

            await asyncio.to_thread(kill, active)
            lastseen = datetime.fromisoformat(str(peers(cluster, peering)[active_id]["lastseen"]))
            expiry = lastseen.timestamp() + LIFETIME  # when kopf counts the silent peer as dead
            killed = time.time()
            await create(cluster, namespace, app("b", {"j1": 1}))
            # As long as the dead replica's record is live, the standby must not act (no split brain):
            # checked until a second before the expiry (clock skew between kopf's stamp and ours).
            while time.time() < expiry - 1.0:
                assert calls_of(standby) == set(), (
                    "the standby acted while the active replica's record was live"
                )
                assert not await asyncio.to_thread(app_pods, cluster, namespace, "b")
                await asyncio.sleep(0.2)
            st_b = await wait_for(
                lambda: settled(cluster, namespace, "b", 1), LIFETIME + 90, "b allocated by the standby"
            )
            took = time.time() - killed
            log.info("standby allocated %.1f s after the kill (peer lifetime %d s)", took, LIFETIME)
            assert ("", "pods", "create") in calls_of(standby)
            assert active_id not in peers(cluster, peering)  # the standby cleared the dead record
            # a's lease and pod were adopted as the dead replica left them; b got the other GPU.
            assert app_status(cluster, namespace, "a")["leases"] == st_a["leases"]
            assert len(app_pods(cluster, namespace, "a")) == 1
            gpus_a = {(node, i) for _, node, i in leased(st_a)}
            gpus_b = {(node, i) for _, node, i in leased(st_b)}
            assert gpus_a.isdisjoint(gpus_b)
            # Bounded: the lifetime, plus the standby's restart of its watches and one round.
            assert took < LIFETIME + 60, took
    finally:
        active.stop()


# --- the renewal ledger across a kill -------------------------------------------------------------------


def ledger_of(cluster: ControlPlane, ns: str) -> dict[str, Any]:
    """The arbiter's renewal ledger in `ns` (controller/ledger.py), parsed; {} while there is none."""
    obj = cluster.get(f"/api/v1/namespaces/{ns}/configmaps/{contract.LEDGER_CONFIGMAP}") or {}
    text = (obj.get("data") or {}).get(contract.LEDGER_KEY)
    return dict(json.loads(text)) if text else {}


def status_expiries(st: dict[str, Any]) -> list[float]:
    return sorted(
        datetime.fromisoformat(le["expiresAt"].replace("Z", "+00:00")).timestamp() for le in st["leases"]
    )


def same_times(a: list[float], b: list[float]) -> bool:
    """Equal to the microsecond status timestamps keep."""
    return len(a) == len(b) and all(abs(x - y) < 1e-5 for x, y in zip(a, b, strict=True))


def ledger_expiries(ledger: dict[str, Any], ns: str, name: str, uid: str) -> list[float] | None:
    entry = (ledger.get("apps") or {}).get(f"{ns}/{name}")
    if not entry or entry[0] != uid:
        return None
    return sorted(float(le[3]) for le in entry[1])


async def test_a_successor_holds_the_leases_renewed_in_the_ledger_after_a_kill(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    # An operator process renews a's lease round after round (8 s leases) while a's status keeps the first
    # expiry (statuses follow only after an hour here): the new expiries are in the ledger alone. It is
    # killed (SIGKILL) with its ledger written and a's status behind, b arrives wanting a's GPUs, and a
    # successor starts with its clock past a's status expiry but before the ledger's. Its first round must
    # hold a's lease until the ledger's expiry: same GPUs, no pod deleted or created, b waits.
    nodes.add(f"{namespace}-n1", gpus=2)
    creds = chart_rbac["operator"]
    argv = ["env", f"KUBECONFIG={creds.kubeconfig}", str(TESSERA), "--log-level", "INFO", "operator",
            "--standalone", "--lease-seconds", "8", "--status-max-staleness-seconds", "3600",
            "--ledger-namespace", namespace, "--metrics-port", "0", "--liveness", ""]  # fmt: skip
    first = cluster.spawn(f"operator-ledger-{os.getpid()}-{time.monotonic_ns()}", argv)
    try:
        await create(cluster, namespace, app("a", {"j1": 2}))
        before = await wait_for(lambda: settled(cluster, namespace, "a", 2), 120, "a on both GPUs")
        uid = str(
            cluster.get(f"/apis/{G}/{V}/namespaces/{namespace}/{contract.PLURAL_APP}/a")["metadata"]["uid"]
        )
        pods_before = pods_by_job(cluster, namespace, "a")
        # A renewal whose expiry only the ledger holds: a's status still says the first one.
        await wait_for(
            lambda: (
                (got := ledger_expiries(ledger_of(cluster, namespace), namespace, "a", uid))
                and got[0] > status_expiries(app_status(cluster, namespace, "a"))[0]
            ),
            120,
            "a renewal of a's lease in the ledger",
        )
        await asyncio.to_thread(kill, first)
    finally:
        first.stop()
    st = app_status(cluster, namespace, "a")
    assert st["leases"] == before["leases"], "the statuses followed before the kill"
    renewed = ledger_expiries(ledger_of(cluster, namespace), namespace, "a", uid)
    assert renewed is not None and renewed[0] > status_expiries(st)[-1]
    # The successor's clock: past a's status expiry, a second before the ledger's.
    clock = ManualClock(renewed[0] - 1.0)
    assert status_expiries(st)[-1] < clock.now
    await create(cluster, namespace, app("b", {"j1": 2}))
    async with operator(
        cluster, creds, namespace, clock=clock, lease_s=8.0, status_max_staleness_s=3600.0,
        ledger_namespace=namespace,
    ) as ctl:  # fmt: skip
        await wait_for(
            lambda: ctl.arbiter is not None and len(ctl.arbiter.records) == 2 and ctl.arbiter.rounds >= 1,
            120,
            "both Apps loaded and a round run",
        )
        await wait_for(lambda: app_status(cluster, namespace, "b").get("conditions"), 60, "b's status")
        ctl.arbiter.dirty = True  # one more full round with everything loaded
        rounds = ctl.arbiter.rounds
        await wait_for(lambda: ctl.arbiter is not None and ctl.arbiter.rounds > rounds, 60, "a round")
        after = await wait_for(
            lambda: (
                (s := app_status(cluster, namespace, "a")) and same_times(status_expiries(s), renewed) and s
            ),
            60,
            "a's status with the ledger's expiry",
        )
        pods_after = pods_by_job(cluster, namespace, "a")
        b_pods = app_pods(cluster, namespace, "b")
        b_status = app_status(cluster, namespace, "b")
    # Same lease: job, node, GPUs and source, held until the ledger's expiry.
    drop = [{k: v for k, v in le.items() if k != "expiresAt"} for le in before["leases"]]
    assert [{k: v for k, v in le.items() if k != "expiresAt"} for le in after["leases"]] == drop
    assert pods_after == pods_before  # the very same pods: none deleted, none made again
    assert not b_pods and not b_status.get("leases")
