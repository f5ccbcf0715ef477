"""Lease bookkeeping of an App (Themis §4.2.2): grants per job and node, expiry at the lease end,
release of finished jobs, and recovery of leases and progress from the status the operator wrote."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tessera.api import contract
from tessera.api.resources import ManifestError
from tessera.controller.apps import AppRecord, record_from_body
from tessera.controller.view import ClusterView

T0 = 1_700_000_000.0
TEMPLATE = {"spec": {"containers": [{"name": "c", "image": "x"}]}}


def cluster_of(nodes: dict[str, int]) -> Any:
    view = ClusterView()
    for name, n in nodes.items():
        inv = [{"uuid": f"{name}-{i}", "index": i, "memoryMiB": 16384} for i in range(n)]
        view.on_node({"metadata": {"name": name, "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}})
    return view.cluster()


def body(jobs: list[dict[str, Any]], status: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": "a", "namespace": "ml", "uid": "u-a"},
        "spec": {"template": TEMPLATE, "jobs": jobs},
    }
    if status is not None:
        out["status"] = status
    return out


def job(name: str, gpus: int, iters: int = 100) -> dict[str, Any]:
    return {"name": name, "iterTotal": iters, "iterTimeSerialSeconds": 1.0, "maxGPUs": gpus}


def record(*jobs: dict[str, Any]) -> AppRecord:
    return record_from_body(body(list(jobs)), T0)


def test_grant_fills_running_jobs_first_then_spec_order_one_lease_per_job_and_node() -> None:
    cluster = cluster_of({"n1": 2, "n2": 3})
    rec = record(job("j1", 3), job("j2", 1))
    first = rec.grant(["n1/0", "n1/1"], T0 + 60, "auction", cluster)
    assert [(lease.job, lease.gpus) for lease in first] == [("j1", ("n1/0", "n1/1"))]
    # j1 already runs: it gets the next GPU (up to maxGPUs 3), then j2; a job never exceeds its maxGPUs.
    second = rec.grant(["n2/0", "n2/1"], T0 + 90, "auction", cluster)
    assert sorted((lease.job, lease.gpus) for lease in second) == [("j1", ("n2/0",)), ("j2", ("n2/1",))]
    assert rec.held() == {"n1/0", "n1/1", "n2/0", "n2/1"} and rec.job_gpus()["j1"] == ["n1/0", "n1/1", "n2/0"]
    # A GPU beyond every job's maxGPUs is not leased.
    assert rec.grant(["n2/2"], T0 + 90, "auction", cluster) == [] and len(rec.held()) == 4


def test_leases_expire_at_their_end_and_not_before() -> None:
    cluster = cluster_of({"n1": 2})
    rec = record(job("j1", 2))
    rec.grant(["n1/0"], T0 + 60, "auction", cluster)
    rec.grant(["n1/1"], T0 + 70, "auction", cluster)
    assert rec.expire(T0 + 59.9) == [] and len(rec.held()) == 2
    gone = rec.expire(T0 + 60)  # a lease ends at its expiry instant (expires <= now)
    assert [lease.gpus for lease in gone] == [("n1/0",)] and rec.held() == {"n1/1"}
    assert [lease.gpus for lease in rec.expire(T0 + 1000)] == [("n1/1",)] and not rec.held()


def test_finished_jobs_release_their_leases() -> None:
    cluster = cluster_of({"n1": 2})
    rec = record(job("j1", 1, iters=10), job("j2", 1, iters=10))
    rec.grant(["n1/0", "n1/1"], T0 + 60, "auction", cluster)
    rec.done_iters["j1"] = 10  # j1 reached its target
    gone = rec.release_finished()
    assert [lease.job for lease in gone] == ["j1"] and [lease.job for lease in rec.leases] == ["j2"]
    assert rec.demand() == 1 and not rec.done
    rec.done_iters["j2"] = 10
    assert [lease.job for lease in rec.release_finished()] == ["j2"] and rec.done and rec.demand() == 0


def test_leases_and_progress_survive_a_round_trip_through_status() -> None:
    cluster = cluster_of({"n1": 2, "n2": 1})
    rec = record(job("j1", 2, iters=100), job("j2", 1, iters=50))
    rec.grant(["n1/0", "n2/0"], T0 + 600, "auction", cluster)
    rec.grant(["n1/1"], T0 + 300, "leftover", cluster)
    rec.done_iters["j1"] = 40
    wire = rec.status(T0 + 10).to_wire()
    back = record_from_body(body([job("j1", 2, iters=100), job("j2", 1, iters=50)], wire), T0 + 20)
    assert sorted((lease.gpus, lease.job, lease.expires, lease.source) for lease in back.leases) == sorted(
        (lease.gpus, lease.job, lease.expires, lease.source) for lease in rec.leases
    )
    assert back.iters_left(back.spec.jobs[0]) == 60 and back.iters_left(back.spec.jobs[1]) == 50
    assert back.start == rec.start


def test_recovery_skips_leases_of_jobs_no_longer_in_the_spec() -> None:
    status = {
        "leases": [
            {"node": "n1", "gpuIndices": [0], "job": "gone", "expiresAt": "2030-01-01T00:00:00Z"},
            {"node": "n1", "gpuIndices": [1], "job": "j1", "expiresAt": "2030-01-01T00:00:00Z"},
        ]
    }
    back = record_from_body(body([job("j1", 1)], status), T0)
    assert [(lease.job, lease.gpus) for lease in back.leases] == [("j1", ("n1/1",))]


def test_bad_spec_is_a_manifest_error_naming_the_field() -> None:
    with pytest.raises(ManifestError, match="maxGPUs"):
        record_from_body(body([job("j1", 0)]), T0)


def test_a_renewal_split_differently_over_grants_leaves_the_status_leases_and_the_ledger_key_alone() -> None:
    """Seen at 1,000 nodes: a round granted an App its GPUs in two grants (auction, then leftover), the
    next round the same (job, GPU) pairs split the other way. The status then differed in its lease
    grouping only, so a renewal was written to status, and the ledger's (job, GPUs) keys no longer
    matched the grouping a restart reads back. Leases of one job on one node with one expiry are one."""
    from tessera.controller.ledger import Entry, Ledger
    from tessera.controller.status_writes import stable_fields, without_expiries

    c = cluster_of({"n1": 8})
    rec = record_from_body(body([job("j1", 2), job("j2", 2)]), T0)
    rec.grant(["n1/0", "n1/1", "n1/2"], T0 + 600, "auction", c)
    rec.grant(["n1/5"], T0 + 600, "leftover", c)
    first = rec.status(T0).to_wire()
    pairs = rec.lease_pairs()
    rec.expire(T0 + 600)
    rec.grant(["n1/0", "n1/1"], T0 + 1200, "auction", c)  # the same pairs, split the other way
    rec.grant(["n1/2", "n1/5"], T0 + 1200, "leftover", c)
    assert rec.lease_pairs() == pairs
    later = rec.status(T0 + 600).to_wire()
    assert without_expiries(stable_fields(later)) == without_expiries(stable_fields(first))
    # A restart reads the first status back; the ledger written for the renewal extends every lease.
    ledger = Ledger(2, T0 + 600, {rec.key: Entry.of(rec)})
    back = record_from_body(body([job("j1", 2), job("j2", 2)], first), T0)
    assert ledger.apply(back)
    assert {le.expires for le in back.leases} == {T0 + 1200}


def test_the_holding_starts_when_gpus_come_after_none_and_a_renewal_continues_it() -> None:
    cluster = cluster_of({"n1": 2})
    rec = record(job("j1", 2))
    rec.note_holding(T0)
    assert rec.held_since is None  # nothing held yet
    rec.grant(["n1/0"], T0 + 100, "auction", cluster)
    rec.note_holding(T0 + 40)
    assert rec.held_since == T0 + 40
    rec.grant(["n1/1"], T0 + 160, "auction", cluster)  # more GPUs: the same holding
    rec.note_holding(T0 + 60)
    # The round at T0+100: the first lease ends and is renewed in the same round; the holding goes on.
    rec.expire(T0 + 100)
    rec.grant(["n1/0"], T0 + 200, "auction", cluster)
    rec.note_holding(T0 + 100)
    assert rec.held_since == T0 + 40
    assert rec.status(T0 + 100).holding_since is not None
    # All of it gone: the holding ends; the next GPUs start another.
    rec.expire(T0 + 300)
    rec.note_holding(T0 + 300)
    assert rec.held_since is None and rec.status(T0 + 300).holding_since is None
    rec.grant(["n1/0"], T0 + 900, "auction", cluster)
    rec.note_holding(T0 + 350)
    assert rec.held_since == T0 + 350


def test_the_holding_start_is_recovered_from_status() -> None:
    cluster = cluster_of({"n1": 2})
    rec = record(job("j1", 2))
    rec.grant(["n1/0", "n1/1"], T0 + 600, "auction", cluster)
    rec.note_holding(T0 + 30)
    status = rec.status(T0 + 50).to_wire()
    again = record_from_body(body([job("j1", 2)], status), T0 + 60)
    assert again.held_since == T0 + 30
    # Leases but no holdingSince (a status written before the field): the holding counts from now.
    status.pop("holdingSince")
    assert record_from_body(body([job("j1", 2)], status), T0 + 60).held_since == T0 + 60
