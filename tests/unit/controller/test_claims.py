"""GPUs objects claim in the API server (controller/claims.py) and how a starting operator keeps those of
objects it has not loaded yet out of every allocation (Controller.unloaded_gpus). No Kubernetes."""

from __future__ import annotations

import json
from typing import Any

import kopf
from tessera.api import contract
from tessera.controller.apps import record_from_body
from tessera.controller.claims import Claim, app_claim, deployment_claim, trialgroup_claim, unloaded
from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import Controller

T0 = 1_700_000_000.0
TEMPLATE = {"spec": {"containers": [{"name": "c", "image": "x"}]}}


def lease(node: str, idx: list[int], expires: str) -> dict[str, Any]:
    return {"node": node, "gpuIndices": idx, "job": "j1", "expiresAt": expires, "source": "auction"}


def app_body(name: str, uid: str, leases: list[dict[str, Any]]) -> dict[str, Any]:
    job = {"name": "j1", "iterTotal": 10, "iterTimeSerialSeconds": 1.0, "maxGPUs": 4}
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"template": TEMPLATE, "jobs": [job]},
        "status": {"leases": leases},
    }


def test_an_apps_claim_is_its_leases_until_each_expires() -> None:
    body = app_body(
        "a", "u1", [lease("n1", [0, 1], "2023-11-14T22:23:20Z"), lease("n2", [3], "2023-11-14T22:13:30Z")]
    )
    claim = app_claim(body)
    assert claim.uid == "u1"
    assert claim.live(T0) == {"n1/0", "n1/1", "n2/3"}
    assert claim.live(T0 + 10) == {"n1/0", "n1/1"}  # n2's lease ended at T0 + 10
    assert app_claim({"metadata": {"uid": "u"}}).gpus == ()


def test_a_groups_claim_is_its_pool_while_it_runs_and_a_deployments_its_replicas() -> None:
    tg = {
        "metadata": {"uid": "t", "annotations": {contract.ANN_GPU_POOL: json.dumps(["n1/0", "n1/1"])}},
        "status": {"phase": "Running"},
    }
    assert trialgroup_claim(tg).live(T0) == {"n1/0", "n1/1"}
    assert trialgroup_claim({**tg, "status": {"phase": "Succeeded"}}).live(T0) == set()
    md = {"metadata": {"uid": "m"}, "status": {"groups": ["n1/2,n1/3", "n2/0"]}}
    assert deployment_claim(md).live(T0) == {"n1/2", "n1/3", "n2/0"}


def test_only_objects_not_loaded_under_the_same_uid_count() -> None:
    index = {
        ("ml", "a"): [Claim("u-a", (("n1/0", None),))],
        ("ml", "b"): [Claim("u-b", (("n1/1", None),))],
        ("ml", "c"): [Claim("u-c2", (("n1/2", None),))],  # recreated: the loaded c is an older object
    }
    assert unloaded(index, {("ml", "a"): "u-a", ("ml", "c"): "u-c1"}, T0) == {"n1/1", "n1/2"}


def test_a_starting_operator_keeps_unloaded_apps_leases_out_of_the_auction() -> None:
    # The arbiter has loaded a; b's handler has not run yet. Themis must not offer b's GPUs, nor may a
    # TrialGroup pool or a serving replica take them.
    ctl = Controller(OperatorConfig(clock=lambda: T0))
    ctl.start(kopf.ConnectionInfo(server="https://127.0.0.1:1"))
    assert ctl.arbiter is not None
    a = app_body("a", "u-a", [lease("n1", [0], "2023-11-14T22:23:20Z")])
    b = app_body("b", "u-b", [lease("n1", [1, 2], "2023-11-14T22:23:20Z")])
    ctl.arbiter.upsert(record_from_body(a, T0))
    ctl.claims = {contract.KIND_APP: {("ml", "a"): [app_claim(a)], ("ml", "b"): [app_claim(b)]}}
    assert ctl.unloaded_gpus() == {"n1/1", "n1/2"}
    assert {"n1/1", "n1/2"} <= ctl.reserved_by_others()
    assert {"n1/1", "n1/2"} <= ctl.serving_and_app_gpus() and {"n1/1", "n1/2"} <= ctl.app_and_pool_gpus()
    ctl.arbiter.upsert(record_from_body(b, T0))  # b's handler ran: its leases are the arbiter's own now
    assert ctl.unloaded_gpus() == set() and "n1/1" not in ctl.reserved_by_others()
