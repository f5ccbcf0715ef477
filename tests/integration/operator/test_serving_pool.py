"""Serving pools: ModelDeployments naming one pool are placed jointly by the AlpaServe planner.

Six 10 ms models (batch 1), 30 ms SLO, Gamma CV 4, 3000 MiB of weights on 4096 MiB lanes (one model per
GPU unsplit), rates 30/30/5/5/2/2 rps, each bringing one GPU: the planner (same inputs, same plan every
run) puts five models on a 4-stage pipeline over 4 GPUs and two on a 2-stage one; the 2 rps model m4 gets
no replica (memory is the limit) and is predicted at 0 %.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kmock
import pytest
from tessera.api import contract
from tessera.controller import pools
from tessera.controller.pools import POOL_LABEL

from .conftest import (
    MDS,
    NS,
    add_node,
    events,
    md_body,
    pods,
    running_operator,
    set_pod_phase,
    status_of,
    wait_for,
)

RATES = {"m0": 30, "m1": 30, "m2": 5, "m3": 5, "m4": 2, "m5": 2}


def member(name: str, rps: float) -> dict[str, Any]:
    body = md_body(
        name,
        rps,
        model={"name": name, "dynamic": False},
        slo={"latencyMs": 30},
        memory={"staticMiB": 3000},
        placement={"pool": "web"},
    )
    body["spec"]["traffic"]["cv"] = 4.0
    return body


def configmap(k: kmock.KubernetesEmulator, name: str) -> dict[str, Any] | None:
    try:
        return dict(k.objects["v1/configmaps", NS, name])
    except KeyError:
        return None


def pool_workers(k: kmock.KubernetesEmulator) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in pods(k, **{"tessera.io/pool": "web"}).items()}


async def test_pool_plan_in_status_workers_per_group_and_routing(
    api: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pools, "DRAIN_TIMEOUT_S", 0.5)  # no gateway runs here to say a group drained
    add_node(api, "n1", 4)
    add_node(api, "n2", 4)
    async with running_operator(api) as ctl:
        await wait_for(lambda: len(ctl.view.nodes) == 2, what="both nodes in the view")
        for name, rps in RATES.items():
            await api.post(
                f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments",
                json=member(name, rps),
            )

        def planned() -> dict[str, dict[str, Any]] | None:
            st = {m: status_of(api, MDS, m) for m in RATES}
            ok = all(len(s.get("poolPlan") or []) == 2 and s.get("profileSynthetic") for s in st.values())
            return st if ok and len({json.dumps(s["poolPlan"]) for s in st.values()}) == 1 else None

        st = await wait_for(planned, what="every member's status showing the same 2-group plan")
        plan = st["m0"]["poolPlan"]
        by_id = {g["id"]: g for g in plan}
        assert sorted((g["pp"], g["op"], tuple(g["models"])) for g in plan) == [
            (2, 1, ("m1", "m3")),
            (4, 1, ("m0", "m1", "m2", "m3", "m5")),
        ]
        for m, s in st.items():
            assert s["pool"] == "web"
            assert s["poolGroups"] == [g["id"] for g in plan if m in g["models"]]
            assert 0 <= s["predictedSLOAttainmentPercent"] <= 100
        assert st["m4"]["poolGroups"] == [] and st["m4"]["predictedSLOAttainmentPercent"] == 0
        assert st["m4"]["phase"] == "Placing" and st["m1"]["replicas"] == 2

        # One worker per group, a gang of the group's GPUs on one node, loading every model of its group.
        got = await wait_for(lambda: len(pool_workers(api)) == 2 and pool_workers(api), what="2 pool workers")
        for pod in got.values():
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            group = by_id[env["TESSERA_POOL_GROUP"]]
            assert env[contract.ENV_MODEL] == ",".join(group["models"])
            assert env["TESSERA_PIPELINE_STAGES"] == str(group["pp"])
            placement = json.loads(pod["metadata"]["annotations"][contract.ANN_PLACEMENT])
            assert len(placement["gpuIndices"]) == group["gpus"]
            assert group["placed"] == ",".join(f"{placement['node']}/{i}" for i in placement["gpuIndices"])
        # The pool gateway routes each model only to the groups holding it, with their stage profiles.
        cm = await wait_for(lambda: configmap(api, "web-pool"), what="pool gateway")
        config = json.loads(cm["data"]["gateway.json"])
        routes = {g["id"]: sorted(g["models"]) for g in config["pool"]["groups"]}
        assert routes == {g["id"]: g["models"] for g in plan}
        assert sorted(m["name"] for m in config["pool"]["models"]) == sorted(RATES)
        for g in config["pool"]["groups"]:
            assert all(len(lat) == g["pp"] for lat in g["models"].values())
        assert events(api, "PoolPlanned")

        # The workers run (the kubelet's part), so a new plan must not cut them off.
        for name in got:
            await set_pod_phase(api, name, "Running")
        await wait_for(
            lambda: (
                all(p.phase == "Running" for p in ctl.view.pods_with(POOL_LABEL, "web", NS))
                and len(ctl.view.pods_with(POOL_LABEL, "web", NS)) == 2
            ),
            what="the operator seeing its workers run",
        )
        # Hysteresis: a 10 % rate change keeps the plan; doubling a rate re-plans.
        planned_events = len(events(api, "PoolPlanned"))
        await api.patch(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments/m2",
            json={"spec": {"traffic": {"expectedRps": 5.5}}},
        )
        await api.patch(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments/m0",
            json={"spec": {"traffic": {"expectedRps": 60}}},
        )
        await wait_for(lambda: len(events(api, "PoolPlanned")) > planned_events, what="a re-plan")
        msgs = [e["message"] for e in events(api, "PoolPlanned")[planned_events:]]
        assert all("m0: rate 30 → 60" in m for m in msgs), msgs

        # Re-placement: new groups come up (Starting), routing switches once their workers run, the old
        # ones drain and go. The kubelet's part: every pool worker pod is set Running as it appears.
        seen: set[str] = set()

        async def settle() -> dict[str, Any] | None:
            for name, pod in pool_workers(api).items():
                if (pod.get("status") or {}).get("phase") != "Running":
                    await set_pod_phase(api, name, "Running")
            plan = status_of(api, MDS, "m0").get("poolPlan") or []
            seen.update(g["state"] for g in plan)
            return status_of(api, MDS, "m0") if plan and all(g["state"] == "Active" for g in plan) else None

        async def until_settled() -> dict[str, Any]:
            deadline = asyncio.get_running_loop().time() + 45
            while asyncio.get_running_loop().time() < deadline:
                if (st := await settle()) and len(pool_workers(api)) == len(st["poolPlan"]):
                    return st
                await asyncio.sleep(0.05)
            raise AssertionError(f"pool never settled; states seen {seen}")

        st = await until_settled()
        new_plan = st["poolPlan"]
        assert "Starting" in seen and ({"Retiring", "Draining"} & seen), seen
        assert len(pool_workers(api)) == len(new_plan)
        config = json.loads(configmap(api, "web-pool")["data"]["gateway.json"])
        assert {g["id"]: sorted(g["models"]) for g in config["pool"]["groups"]} == {
            g["id"]: g["models"] for g in new_plan
        }
        assert config["pool"]["reload_from"] == "/etc/tessera/gateway.json"
        assert events(api, "PoolSwitch")
