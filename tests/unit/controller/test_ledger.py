"""The renewal ledger's recovery merge and wire form (controller/ledger.py), without an API."""

from __future__ import annotations

import json
from typing import Any

from tessera.controller.apps import AppRecord, LeaseRec, record_from_body
from tessera.controller.claims import Claim
from tessera.controller.ledger import MAX_BYTES, Entry, Ledger, fit

T0 = 1_700_000_000.0


def record(name: str = "a", uid: str = "u-a", leases: list[LeaseRec] | None = None) -> AppRecord:
    body: dict[str, Any] = {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "App",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
            "jobs": [
                {"name": "j1", "iterTotal": 100, "iterTimeSerialSeconds": 1.0, "maxGPUs": 2},
                {"name": "j2", "iterTotal": 100, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1},
            ],
        },
    }
    rec = record_from_body(body, T0)
    rec.leases = list(leases or [])
    return rec


def lease(job: str, gpus: tuple[str, ...], expires: float) -> LeaseRec:
    return LeaseRec(gpus, job, expires, "auction")


def test_a_renewed_lease_is_held_until_the_ledgers_expiry() -> None:
    renewed = record(leases=[lease("j1", ("n1/0", "n1/1"), T0 + 200), lease("j2", ("n2/0",), T0 + 150)])
    ledger = Ledger.from_json(Ledger(3, T0 + 100, {("ml", "a"): Entry.of(renewed)}).to_json())
    # What the status says: the first expiry of both leases.
    rec = record(leases=[lease("j1", ("n1/0", "n1/1"), T0 + 100), lease("j2", ("n2/0",), T0 + 150)])
    assert ledger.apply(rec)
    assert [(le.job, le.gpus, le.expires) for le in rec.leases] == [
        ("j1", ("n1/0", "n1/1"), T0 + 200),
        ("j2", ("n2/0",), T0 + 150),
    ]


def test_entries_that_no_longer_match_change_nothing() -> None:
    ledger = Ledger(3, T0, {("ml", "a"): Entry("u-a", {("j1", ("n1/0", "n1/1")): T0 + 200})})
    cases = {
        "another App of the same name (deleted, made again)": record(
            uid="u-other", leases=[lease("j1", ("n1/0", "n1/1"), T0 + 100)]
        ),
        "the lease moved since": record(leases=[lease("j1", ("n1/0", "n1/2"), T0 + 100)]),
        "another job on those GPUs": record(leases=[lease("j2", ("n1/0", "n1/1"), T0 + 100)]),
        "status written since, with a later expiry": record(leases=[lease("j1", ("n1/0", "n1/1"), T0 + 300)]),
        "the lease lost since": record(leases=[]),
        "an App the ledger does not name": record(name="b", leases=[lease("j1", ("n1/0", "n1/1"), T0)]),
    }
    for why, rec in cases.items():
        before = [(le.job, le.gpus, le.expires) for le in rec.leases]
        assert not ledger.apply(rec), why
        assert [(le.job, le.gpus, le.expires) for le in rec.leases] == before, why


def test_the_claim_of_an_app_not_loaded_yet_is_extended_for_its_own_uid_only() -> None:
    ledger = Ledger(3, T0, {("ml", "a"): Entry("u-a", {("j1", ("n1/0", "n1/1")): T0 + 200})})
    claim = Claim("u-a", (("n1/0", T0 + 100), ("n1/1", T0 + 100), ("n2/0", T0 + 150)))
    assert ledger.claim(("ml", "a"), claim).gpus == (
        ("n1/0", T0 + 200),
        ("n1/1", T0 + 200),
        ("n2/0", T0 + 150),
    )
    assert ledger.claim(("ml", "a"), claim).live(T0 + 160) == {"n1/0", "n1/1"}
    other = Claim("u-other", claim.gpus)
    assert ledger.claim(("ml", "a"), other) == other


def test_an_unreadable_ledger_or_entry_is_left_out() -> None:
    assert Ledger.from_json("not json").apps == {}
    good = Entry("u-a", {("j1", ("n1/0",)): T0})
    text = json.dumps({"round": 1, "at": T0, "apps": {"ml/a": good.wire(), "ml/b": ["u-b", [["j1"]]]}})
    assert set(Ledger.from_json(text).apps) == {("ml", "a")}
    assert Ledger.from_configmap({}, "ledger").apps == {}


def test_five_thousand_apps_fit_in_one_configmap() -> None:
    # 5,000 Apps with two leases each and names of a usual length stay well under the 1 MiB object limit.
    entries = {
        (f"team-{i % 40:02d}", f"resnet-sweep-{i:05d}"): Entry(
            f"{i:08x}-9746-4cda-80ba-8694232047ad",
            {
                ("trainer", (f"gpu-node-{i % 625:04d}/{i % 8}",)): T0 + 600.5,
                ("eval", (f"gpu-node-{i % 625:04d}/7",)): T0,
            },
        )
        for i in range(5000)
    }
    kept, over = fit(entries.items())
    assert not over and len(kept) == 5000
    size = len(Ledger(1, T0, kept).to_json())
    assert size < MAX_BYTES < 1024 * 1024, size


def test_apps_past_the_size_limit_are_left_to_a_status_write() -> None:
    entries = [(("ns", f"a{i}"), Entry(f"u{i}", {("j", (f"n/{i}",)): T0})) for i in range(100)]
    kept, over = fit(entries, limit=2000)
    assert kept and over and len(kept) + len(over) == 100
    assert len(Ledger(1, T0, kept).to_json()) <= 2000
