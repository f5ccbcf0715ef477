"""The arbiter's renewal ledger against kmock: a round that only renews leases writes one ledger object and
no App status; the statuses follow with the refreshes; a restarted operator holds each renewed lease until
the ledger's expiry, so a lease whose status expiry has passed is neither lost nor handed to another App."""

from __future__ import annotations

import json
from typing import Any

import kmock
from tessera.api import contract
from tessera.controller.apps import to_time

from .conftest import APPS, NS, ManualClock, add_node, app_body, job, pods, running_operator, wait_for

CONFIGMAPS = "v1/configmaps"
LEDGER_NS = "default"
STALE = 10_000.0  # status staleness: no refresh during the test unless it asks for one


def status(k: kmock.KubernetesEmulator, name: str) -> dict[str, Any]:
    return dict(k.objects[APPS, NS, name]).get("status") or {}


def expiries(k: kmock.KubernetesEmulator, name: str) -> list[float]:
    return sorted(float(to_time(le["expiresAt"]) or 0) for le in status(k, name).get("leases") or [])


def ledger(k: kmock.KubernetesEmulator) -> dict[str, Any]:
    try:
        obj = dict(k.objects[CONFIGMAPS, LEDGER_NS, contract.LEDGER_CONFIGMAP])
    except KeyError:
        return {}
    return dict(json.loads(obj["data"][contract.LEDGER_KEY]))


def writes(k: kmock.KubernetesEmulator) -> list[str]:
    """The operator's write requests so far, as "METHOD plural[/sub] name": statuses, pods, the ledger."""
    out = []
    for r in k:
        if r.method.value in ("POST", "PATCH", "PUT", "DELETE") and r.resource is not None:
            if r.resource.plural == "events":
                continue  # best effort, outside the round's promise (none for a renewal anyway)
            sub = f"/{r.subresource}" if r.subresource else ""
            if r.resource.plural == "apps" and not sub:
                continue  # kopf's own (finalizer, last-handled annotation), none of the round's
            out.append(f"{r.method.value} {r.resource.plural}{sub} {r.name or ''}".strip())
    return out


async def settle(ctl: Any) -> None:
    arbiter = ctl.arbiter
    await wait_for(
        lambda: arbiter is not None and not arbiter.lock.locked() and not arbiter.dirty, what="quiet"
    )


async def test_a_round_that_only_renews_writes_the_ledger_and_no_status(
    api: kmock.KubernetesEmulator,
) -> None:
    clock = ManualClock()
    add_node(api, "n1", 4)
    for n in ("a", "b"):
        api.objects[APPS, NS, n] = app_body(n, [job("j1", iters=10**6, gpus=2)])
    async with running_operator(api, lease_s=100.0, clock=clock, status_max_staleness_s=STALE) as ctl:
        await wait_for(lambda: all(status(api, n).get("leases") for n in ("a", "b")), what="both leases")
        await wait_for(lambda: len(pods(api)) == 2, what="both pods")
        await settle(ctl)
        arbiter = ctl.arbiter
        assert arbiter is not None
        first = {n: expiries(api, n) for n in ("a", "b")}
        names = set(pods(api))
        for round_ in (1, 2):
            seen, rounds = len(writes(api)), arbiter.rounds
            clock.advance(150.0)  # every lease expires; nobody else bids: each App gets its GPUs again
            await wait_for(lambda r=rounds: arbiter.rounds > r, what=f"renewal round {round_}")
            await settle(ctl)
            # Apps whose leases changed: none. Writes: the ledger, once (created, then patched).
            verb = "POST" if round_ == 1 else "PATCH"
            assert writes(api)[seen:] == [
                f"{verb} configmaps" + ("" if round_ == 1 else f" {contract.LEDGER_CONFIGMAP}")
            ]
            got = ledger(api)
            until = clock.now + 100.0
            assert set(got["apps"]) == {f"{NS}/a", f"{NS}/b"}
            for n in ("a", "b"):
                uid, leases = got["apps"][f"{NS}/{n}"]
                assert uid == dict(api.objects[APPS, NS, n])["metadata"]["uid"]
                assert [(le[0], le[1], sorted(le[2]), le[3]) for le in leases] == [
                    (le["job"], le["node"], sorted(le["gpuIndices"]), until)
                    for le in status(api, n)["leases"]
                ]
                assert expiries(api, n) == first[n]  # status not written: it lags the ledger
            assert set(pods(api)) == names
        # A round with no renewal (something else changed) writes nothing for the lagging Apps.
        seen, rounds = len(writes(api)), arbiter.rounds
        arbiter.dirty = True
        await wait_for(lambda: arbiter.rounds > rounds, what="a round without renewals")
        assert writes(api)[seen:] == []
        # Between rounds the statuses follow, as age-only refreshes do (here: once they are due by age).
        assert arbiter.lagging == {(NS, "a"), (NS, "b")}
        later = clock.now + STALE
        for _ in range(4):
            arbiter._last_heartbeat = -1e18  # one tick's budget per call, whatever the clock
            await arbiter.refresh_stale(later)
        assert arbiter.lagging == set()
        for n in ("a", "b"):
            assert expiries(api, n) == [clock.now + 100.0] * len(first[n])
    assert sum(1 for w in writes(api) if w.startswith("POST pods")) == 2


async def test_a_restart_holds_renewed_leases_until_the_ledger_says(api: kmock.KubernetesEmulator) -> None:
    # a holds both GPUs; its lease is renewed while its status keeps the first expiry. The operator stops,
    # b arrives wanting the same GPUs, and the clock is past z's status expiry. The successor must hold
    # z's lease until the ledger's expiry: no pod deleted or created, b waits.
    clock = ManualClock()
    add_node(api, "n1", 2)
    api.objects[APPS, NS, "z"] = app_body("z", [job("j1", iters=10**6, gpus=2)])
    async with running_operator(api, lease_s=100.0, clock=clock, status_max_staleness_s=STALE) as ctl:
        await wait_for(lambda: status(api, "z").get("leases") and pods(api), what="z's lease and pod")
        await settle(ctl)
        assert ctl.arbiter is not None
        before = status(api, "z")["leases"]
        rounds = ctl.arbiter.rounds
        clock.advance(150.0)
        await wait_for(lambda: ctl.arbiter is not None and ctl.arbiter.rounds > rounds, what="the renewal")
        await settle(ctl)
    assert f"{NS}/z" in ledger(api)["apps"]
    assert status(api, "z")["leases"] == before  # the status still says the first expiry ...
    renewed_until = clock.now + 100.0
    clock.advance(50.0)  # before the ledger's expiry
    assert max(expiries(api, "z")) < clock.now  # ... which has passed
    names = set(pods(api))
    seen = len(writes(api))
    api.objects[APPS, NS, "b"] = app_body("b", [job("j1", iters=10**6, gpus=2)])
    async with running_operator(api, lease_s=100.0, clock=clock, status_max_staleness_s=STALE) as ctl2:
        await wait_for(
            lambda: ctl2.arbiter is not None and len(ctl2.arbiter.records) == 2 and ctl2.arbiter.rounds >= 1,
            what="both Apps loaded and a round",
        )
        await wait_for(lambda: status(api, "b").get("conditions"), what="b's status")
        await wait_for(
            lambda: expiries(api, "z") == [renewed_until], what="z's status with the ledger's expiry"
        )
        await settle(ctl2)
        assert ctl2.arbiter is not None
        ctl2.arbiter.dirty = True  # one more round with everything loaded
        rounds = ctl2.arbiter.rounds
        await wait_for(lambda: ctl2.arbiter is not None and ctl2.arbiter.rounds > rounds, what="a round")
        await settle(ctl2)
    assert [(le["node"], le["gpuIndices"], le["job"]) for le in status(api, "z")["leases"]] == [
        (le["node"], le["gpuIndices"], le["job"]) for le in before
    ]
    assert expiries(api, "z") == [renewed_until]
    assert not status(api, "b").get("leases")
    assert set(pods(api)) == names
    assert not [w for w in writes(api)[seen:] if w.split()[1] == "pods"]


async def test_leases_that_end_on_a_cluster_with_room_are_renewed_where_they_were(
    api: kmock.KubernetesEmulator,
) -> None:
    """Twelve Apps placed in one round, so their leases end together; the cluster has room and nobody else
    wants GPUs, so each App gets back the GPUs its jobs ran on: no pod moves, and the round records the
    renewals in the ledger and writes no lease to status (ThemisConfig.renew_in_place). Placed afresh
    (`renew_in_place: false`), Apps returning together land on one another's GPUs."""
    clock = ManualClock()
    for node in ("n1", "n2", "n3", "n4"):
        add_node(api, node, 8)
    shapes = {f"app{i}": [job("j1", iters=10**6, gpus=1 + i % 3)] for i in range(12)}
    shapes["app0"].append(job("j2", iters=10**6, gpus=1))
    for n, jobs in shapes.items():
        api.objects[APPS, NS, n] = app_body(n, jobs)
    async with running_operator(api, lease_s=100.0, clock=clock, status_max_staleness_s=STALE) as ctl:
        await wait_for(lambda: all(status(api, n).get("leases") for n in shapes), what="every lease")
        await settle(ctl)
        arbiter = ctl.arbiter
        assert arbiter is not None
        where = {k: v["spec"].get("nodeName") for k, v in pods(api).items()}
        held = {k: r.lease_pairs() for k, r in arbiter.records.items()}
        for round_ in (1, 2):
            seen, rounds = len(writes(api)), arbiter.rounds
            clock.advance(150.0)  # every lease ends
            await wait_for(lambda r=rounds: arbiter.rounds > r, what=f"round {round_}")
            await settle(ctl)
            assert {k: r.lease_pairs() for k, r in arbiter.records.items()} == held
            assert {k: v["spec"].get("nodeName") for k, v in pods(api).items()} == where
            assert not [w for w in writes(api)[seen:] if "pods" in w or "apps/status" in w]
            assert set(ledger(api)["apps"]) == {f"{NS}/{n}" for n in shapes}
