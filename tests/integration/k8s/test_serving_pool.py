"""A serving pool on a real control plane: six ModelDeployments naming one pool, placed jointly by the
AlpaServe planner (same inputs as tests/integration/operator/test_serving_pool.py, so the same plan): the
plan in every member's status as the API server stores it (status fields the CRD did not declare would be
pruned), one worker per group bound by the real kube-scheduler through the extender on the group's GPUs
(a 4-GPU gang on one node and a 2-GPU one), and the pool gateway's config routing each model only to the
groups holding it.
"""

from __future__ import annotations

import json
from typing import Any

from tessera.api import contract

from .conftest import Credentials, Nodes, Scheduling, wait_for
from .controlplane import ControlPlane
from .workloads import bound, call, cr_path, kubelet, modeldeployment, operator, placement_of, status_of

RATES = {"m0": 30, "m1": 30, "m2": 5, "m3": 5, "m4": 2, "m5": 2}


def member(name: str, rps: float) -> dict[str, Any]:
    body = modeldeployment(name, rps)
    spec = body["spec"]
    spec["model"] = {"name": name, "dynamic": False}
    spec["slo"] = {"latencyMs": 30}
    spec["memory"] = {"staticMiB": 3000}
    spec["placement"] = {"pool": "web"}
    spec["traffic"]["cv"] = 4.0
    return body


def pool_workers(cluster: ControlPlane, ns: str) -> list[dict[str, Any]]:
    got = cluster.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=tessera.io%2Fpool%3Dweb") or {}
    return [
        p
        for p in got.get("items") or []
        if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "worker"
        and not p["metadata"].get("deletionTimestamp")
    ]


async def test_pool_plan_in_status_and_group_workers_bound(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    n1 = nodes.add(f"{namespace}-n1", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    n2 = nodes.add(f"{namespace}-n2", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    # The kubelet's part: a worker the operator deletes while it re-plans holds its lanes until it is gone.
    async with (
        kubelet(cluster, namespace),
        operator(cluster, chart_rbac["operator"], namespace, serving_stats_interval_s=0) as ctl,
    ):
        await wait_for(lambda: {n1, n2} <= set(ctl.view.nodes), 60, "both nodes in the operator's view")
        for name, rps in RATES.items():
            await call(
                cluster, "POST", cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace), member(name, rps)
            )

        def planned() -> dict[str, dict[str, Any]] | None:
            st = {m: status_of(cluster, contract.PLURAL_MODELDEPLOYMENT, namespace, m) for m in RATES}
            plans = {json.dumps(s.get("poolPlan")) for s in st.values()}
            first = st["m0"].get("poolPlan") or []
            settled = len(first) == 2 and all(g.get("state") == "Active" for g in first)
            return st if settled and len(plans) == 1 else None

        last: dict[str, Any] = {}

        def planned_or_keep() -> dict[str, dict[str, Any]] | None:
            got = planned()
            last["st"] = {m: status_of(cluster, contract.PLURAL_MODELDEPLOYMENT, namespace, m) for m in RATES}
            return got

        try:
            st = await wait_for(planned_or_keep, 120, "every member's status showing the same 2-group plan")
        except AssertionError:
            print(json.dumps(last, indent=1)[:6000])
            raise
        plan = st["m0"]["poolPlan"]
        assert sorted((g["pp"], g["op"], tuple(g["models"])) for g in plan) == [
            (2, 1, ("m1", "m3")),
            (4, 1, ("m0", "m1", "m2", "m3", "m5")),
        ]
        for m, s in st.items():
            assert s["pool"] == "web" and s["profileSynthetic"] is True
            assert s["poolGroups"] == [g["id"] for g in plan if m in g["models"]]
        assert st["m4"]["predictedSLOAttainmentPercent"] == 0 and st["m4"]["phase"] == "Placing"

        got = await wait_for(
            lambda: (w := pool_workers(cluster, namespace)) and len(w) == 2 and bound(w) and w,
            120,
            "2 pool workers bound",
        )
        by_id = {g["id"]: g for g in plan}
        for pod in got:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            group = by_id[env["TESSERA_POOL_GROUP"]]
            assert env[contract.ENV_MODEL] == ",".join(group["models"])
            placement = placement_of(pod)
            assert pod["spec"]["nodeName"] == placement["node"]
            assert len(placement["gpuIndices"]) == group["gpus"]
            assert pod["spec"]["containers"][0]["resources"]["limits"][contract.RESOURCE_GPU] == str(
                group["gpus"]
            )
        cm = await wait_for(
            lambda: cluster.get(f"/api/v1/namespaces/{namespace}/configmaps/web-pool"), 60, "pool gateway"
        )
        config = json.loads(cm["data"]["gateway.json"])
        assert {g["id"]: sorted(g["models"]) for g in config["pool"]["groups"]} == {
            g["id"]: g["models"] for g in plan
        }
        assert cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web-pool")

        # Every member owns the gateway's objects and the ConfigMap owns the workers, so deleting the
        # first member by name leaves them to the garbage collector's care only once all members go.
        mds = {
            m: cluster.get(cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace, m))["metadata"]["uid"]
            for m in RATES
        }
        deploy = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web-pool")
        for obj in (cm, deploy):
            assert sorted(r["uid"] for r in obj["metadata"]["ownerReferences"]) == sorted(mds.values())
        for pod in got:
            assert [r["uid"] for r in pod["metadata"]["ownerReferences"]] == [cm["metadata"]["uid"]]
        # A ConfigMap m0 alone owns: once it is gone, the garbage collector has handled m0's deletion.
        await call(
            cluster, "POST", f"/api/v1/namespaces/{namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "m0-only", "ownerReferences": [{
                 "apiVersion": contract.API_VERSION, "kind": "ModelDeployment", "name": "m0", "uid": mds["m0"]}]}},
        )  # fmt: skip
        await call(cluster, "DELETE", cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace, "m0"))
        await wait_for(
            lambda: (
                cluster.get(f"/api/v1/namespaces/{namespace}/configmaps/m0-only") is None
                and cluster.get(cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace, "m0")) is None
            ),
            120,
            "m0 and what it alone owned deleted",
        )
        left = sorted(u for m, u in mds.items() if m != "m0")

        def owned_by_the_rest() -> dict[str, Any] | None:
            now = cluster.get(f"/api/v1/namespaces/{namespace}/configmaps/web-pool") or {}
            refs = sorted(r["uid"] for r in (now.get("metadata") or {}).get("ownerReferences") or [])
            return now if refs == left else None

        now = await wait_for(owned_by_the_rest, 60, "the pool ConfigMap owned by the five members left")
        assert now["metadata"]["uid"] == cm["metadata"]["uid"]  # never deleted and recreated
        again = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web-pool")
        assert again is not None and again["metadata"]["uid"] == deploy["metadata"]["uid"]
        workers = pool_workers(cluster, namespace)
        assert workers and all(
            [r["uid"] for r in p["metadata"]["ownerReferences"]] == [cm["metadata"]["uid"]] for p in workers
        )
