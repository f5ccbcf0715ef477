"""Per-model GPU caps of a queue (`maxGPUsByModel`) in the division and the auction."""

from __future__ import annotations

import random

from tessera.api.queue import QueueSpec
from tessera.cluster import Cluster
from tessera.controller.queue_status import RoundFacts, Workload, model_quota_block, why_waiting
from tessera.policy.queues import QueueNode
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis
from tessera.policy.training import check_decision

from tests.unit.queues.test_queue_policies import app, granted

# 4 A100s on one machine and 4 V100s on another.
MIXED = Cluster(
    (
        *Cluster.build([(1, 4)], model="A100", prefix="a").machines,
        *Cluster.build([(1, 4)], model="V100", prefix="v").machines,
    )
)


def models(gpus: tuple[str, ...] | frozenset[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in gpus:
        m = MIXED.gpu(g).model
        out[m] = out.get(m, 0) + 1
    return out


def test_a_queues_apps_get_no_more_gpus_of_a_model_than_its_cap() -> None:
    # Queue a may hold 1 A100; its App wants 6: it gets 1 A100 and the 4 V100s, never a second A100.
    qs = [QueueNode("a")]
    apps = [app("a1", "a", 6)]
    policy = QueuedPolicy(Themis(), qs, model_caps={"a": {"A100": 1}})
    d = policy.allocate(0.0, apps, MIXED, MIXED.gpu_ids, random.Random(0))
    check_decision(d, apps, MIXED.gpu_ids)
    assert models(d.granted()["a1"]) == {"A100": 1, "V100": 4}


def test_the_cap_counts_what_the_apps_hold_and_leaves_the_rest_to_other_queues() -> None:
    # a's App holds 2 A100s of its cap of 2: a second App of a gets none of the free A100s; b's App does.
    qs = [QueueNode("a", guaranteed=4), QueueNode("b")]
    held = ("a000/0", "a000/1")
    apps = [app("a1", "a", 2, held), app("a2", "a", 2), app("b1", "b", 2)]
    free = [g for g in MIXED.gpu_ids if g not in held]
    policy = QueuedPolicy(Themis(), qs, model_caps={"a": {"A100": 2}, "b": {"V100": 0}})
    d = policy.allocate(0.0, apps, MIXED, free, random.Random(0))
    check_decision(d, apps, free)
    got = d.granted()
    assert models(got.get("a2", frozenset())) == {"V100": 2}
    assert models(got["b1"]) == {"A100": 2}


def test_a_capped_queue_is_owed_no_more_than_its_caps_let_it_use() -> None:
    # Only A100s, a capped at 1 of them: its share is 1 however large its guarantee, so b gets the other 3.
    cluster = Cluster.build([(1, 4)], model="A100")
    qs = [QueueNode("a", guaranteed=4), QueueNode("b")]
    apps = [app("a1", "a", 4), app("b1", "b", 4)]
    policy = QueuedPolicy(Themis(), qs, model_caps={"a": {"A100": 1}})
    d = policy.allocate(0.0, apps, cluster, cluster.gpu_ids, random.Random(0))
    assert granted(d) == {"a1": 1, "b1": 3}
    assert d.record["queues"]["a"]["share"] == 1.0


def test_without_caps_nothing_changes() -> None:
    qs = [QueueNode("a")]
    apps = [app("a1", "a", 8)]
    d = QueuedPolicy(Themis(), qs, model_caps={"a": {}}).allocate(
        0.0, apps, MIXED, MIXED.gpu_ids, random.Random(0)
    )
    assert granted(d) == {"a1": 8}


def test_the_pending_reason_names_the_models_at_their_cap() -> None:
    caps = {"A100": 1}
    assert model_quota_block("a", caps, {"A100": 1}, {"A100": 3}) == (
        "queue a's Apps hold their maxGPUsByModel of every model free now (A100 1 of 1)"
    )
    assert model_quota_block("a", caps, {"A100": 0}, {"A100": 3}) == ""  # below the cap
    assert model_quota_block("a", caps, {"A100": 1}, {"A100": 3, "V100": 1}) == ""  # a V100 is free
    assert model_quota_block("a", caps, {"A100": 1}, {}) == ""  # nothing free: another reason


def test_an_app_of_a_blocked_queue_waits_for_queue_model_quota_other_kinds_do_not() -> None:
    facts = RoundFacts(now=0.0, free=3, model_blocked={"a": "queue a's Apps hold ..."})
    spec = QueueSpec.model_validate({"maxGPUsByModel": {"A100": 1}})
    app_w = Workload("App", "ns", "train", 1.0, 1.0)
    pod_w = Workload("Pod", "ns", "p", 0.0, 1.0)
    assert why_waiting(app_w, "a", spec, 1.0, 4.0, facts)[0] == "QueueModelQuota"
    assert why_waiting(pod_w, "a", spec, 1.0, 4.0, facts)[0] == "NextRound"
