"""Serving pools: ModelDeployments naming one pool are placed jointly by the AlpaServe planner.

Six 10 ms models (batch 1), 30 ms SLO, Gamma CV 4, 3000 MiB of weights on 4096 MiB lanes (one model per
GPU unsplit), rates 30/30/5/5/2/2 rps, each bringing one GPU: the planner (same inputs, same plan every
run) puts five models on a 4-stage pipeline over 4 GPUs and two on a 2-stage one; the 2 rps model m4 gets
no replica (memory is the limit) and is predicted at 0 %.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from aiohttp import web
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


@pytest.fixture(autouse=True)
async def configmap_uids(api: kmock.KubernetesEmulator) -> AsyncIterator[None]:
    """The API server's part kmock leaves out: a uid on every ConfigMap created (the pool gateway's
    ConfigMap owns the workers, and an ownerReference needs its uid)."""

    async def give() -> None:
        n = 0
        while True:
            for (resource, ns, name), obj in list(api.objects.items()):
                if resource.plural == "configmaps" and not (dict(obj).get("metadata") or {}).get("uid"):
                    n += 1
                    path = f"/api/v1/namespaces/{ns}/configmaps/{name}"
                    await api.patch(path, json={"metadata": {"uid": f"uid-cm-{name}-{n}"}})
            await asyncio.sleep(0.02)

    task = asyncio.create_task(give())
    yield
    task.cancel()


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


def deployment(k: kmock.KubernetesEmulator, name: str) -> dict[str, Any] | None:
    try:
        return dict(k.objects["apps/v1/deployments", NS, name])
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
        # The prediction as a metric too, next to the observed tessera_serving_requests_total.
        for m, s in st.items():
            got = ctl.metrics.registry.get_sample_value(
                "tessera_serving_predicted_slo_attainment_ratio",
                {"namespace": NS, "modeldeployment": m, "pool": "web"},
            )
            assert got == pytest.approx(s["predictedSLOAttainmentPercent"] / 100, abs=1e-4), m
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
        switch_events = len(events(api, "PoolSwitch"))
        old_groups = {(tuple(g["models"]), g.get("pp")) for g in status_of(api, MDS, "m0")["poolPlan"]}
        await api.patch(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments/m2",
            json={"spec": {"traffic": {"expectedRps": 5.5}}},
        )
        # The re-plan below then sees m2 at 5.5 every run (same inputs, same plan).
        await wait_for(
            lambda: ctl.deployments.records[NS, "m2"].spec.traffic.expected_rps == 5.5,
            what="m2's new rate read",
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
        # States seen in status, and the transitions the PoolSwitch events record (a state that lasted one
        # pass can be gone before a status read).
        for e in events(api, "PoolSwitch")[switch_events:]:
            seen.update(w for w in e["message"].split() if w in ("Starting", "Retiring", "Draining"))
        # Groups the re-plan keeps as they were stay Active; a switch happens only where the plan changed.
        changed = {(tuple(g["models"]), g.get("pp")) for g in new_plan} != old_groups
        assert not changed or ("Starting" in seen and ({"Retiring", "Draining"} & seen)), (
            seen,
            [e["message"] for e in events(api, "PoolPlanned")],
            [e["message"] for e in events(api, "PoolSwitch")],
            switch_events,
        )
        assert len(pool_workers(api)) == len(new_plan)
        config = json.loads(configmap(api, "web-pool")["data"]["gateway.json"])
        assert {g["id"]: sorted(g["models"]) for g in config["pool"]["groups"]} == {
            g["id"]: g["models"] for g in new_plan
        }
        assert config["pool"]["reload_from"] == "/etc/tessera/gateway.json"
        assert events(api, "PoolSwitch")


async def collect_garbage(k: kmock.KubernetesEmulator, uid: str) -> None:
    """What Kubernetes' garbage collector does once an owner is gone (kmock has none): drop its
    ownerReference from every dependent, and delete a dependent left with no owner."""
    for (resource, ns, name), obj in list(k.objects.items()):
        refs = (dict(obj).get("metadata") or {}).get("ownerReferences") or []
        if not any(r.get("uid") == uid for r in refs):
            continue
        root = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
        path = f"{root}/namespaces/{ns}/{resource.plural}/{name}"
        left = [r for r in refs if r.get("uid") != uid]
        if left:
            await k.patch(path, json={"metadata": {"ownerReferences": left}})
        else:
            await k.delete(path)


async def test_pool_objects_outlive_any_one_member(
    api: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every member owns the pool gateway's objects, whose ConfigMap owns the workers: deleting the first
    member by name (once their only owner) leaves them in place, neither deleted by the operator nor
    garbage-collected."""
    monkeypatch.setattr(pools, "DRAIN_TIMEOUT_S", 0.5)
    add_node(api, "n1", 4)
    add_node(api, "n2", 4)
    rates = {"m0": 30, "m1": 30, "m2": 5, "m3": 5}
    api_path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments"
    async with running_operator(api) as ctl:
        await wait_for(lambda: len(ctl.view.nodes) == 2, what="both nodes in the view")
        for name, rps in rates.items():
            await api.post(api_path, json=member(name, rps))
        uids = {m: f"uid-{m}" for m in rates}

        def owned_by(body: dict[str, Any]) -> list[str]:
            return [r["uid"] for r in body["metadata"].get("ownerReferences") or []]

        def all_owned() -> bool:
            """The gateway's objects owned by every member left, the workers by the gateway's ConfigMap."""
            cm = configmap(api, "web-pool")
            objs = [deployment(api, "web-pool"), cm]
            if cm is None or any(o is None or sorted(owned_by(o)) != sorted(uids.values()) for o in objs):
                return False
            workers = pool_workers(api).values()
            return bool(workers) and all(owned_by(p) == [cm["metadata"]["uid"]] for p in workers)

        def settled() -> bool:
            plan = status_of(api, MDS, "m0").get("poolPlan") or []
            return (
                len(plan) == len(pool_workers(api)) > 0
                and all(g["state"] == "Active" for g in plan)
                and {m for g in plan for m in g["models"]} == set(rates)
            )

        await wait_for(lambda: settled() and all_owned(), what="a plan of all four, its objects owned by all")
        refs = dict(configmap(api, "web-pool") or {})["metadata"]["ownerReferences"]
        assert [r["controller"] for r in refs] == [True, False, False, False]
        workers = set(pool_workers(api))
        assert workers
        for name in workers:  # running workers: a re-plan keeps them until new ones run (none will here)
            await set_pod_phase(api, name, "Running")
        await wait_for(
            lambda: (
                sum(p.phase == "Running" for p in ctl.view.pods_with(POOL_LABEL, "web", NS)) == len(workers)
            ),
            what="the operator seeing its workers run",
        )
        # A mark the operator does not write: a recreated ConfigMap would not carry it.
        await api.patch(
            f"/api/v1/namespaces/{NS}/configmaps/web-pool", json={"metadata": {"labels": {"mark": "1"}}}
        )

        await api.delete(f"{api_path}/m0")
        await wait_for(lambda: (MDS, NS, "m0") not in api.objects, what="m0 gone")
        await collect_garbage(api, uids["m0"])
        del uids["m0"]
        # The operator's delete handler left the pool's workers alone (the re-plan without m0 keeps them
        # routed until new workers run), and the GC found other owners on everything.
        assert workers <= set(pool_workers(api))
        cm = configmap(api, "web-pool")
        assert cm is not None and cm["metadata"]["labels"].get("mark") == "1"
        assert deployment(api, "web-pool") is not None
        await wait_for(all_owned, what="ownerReferences down to the three members left")
        assert dict(configmap(api, "web-pool") or {})["metadata"]["labels"].get("mark") == "1"
        st = await wait_for(
            lambda: (
                (s := status_of(api, MDS, "m1")).get("poolPlan")
                and all(
                    "m0" not in g["models"] for g in s["poolPlan"] if g["state"] in ("Starting", "Active")
                )
                and s
            ),
            what="a plan without m0",
        )
        assert st["pool"] == "web"


async def test_observed_load_replans_past_the_hysteresis(
    api: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool is planned from expectedRps (30 rps each) until its gateway reports a window: m0's offered
    load then reads 60 rps (2× its expectedRps, past the 25 % band) and the pool re-plans for it; m1's
    observed 31.5 rps (5 %) alone would not. The /stats answers are the pool gateway's document shape (the
    e2e test checks the operator parses a real one); counters grow with the server's clock."""
    monkeypatch.setattr(pools, "DRAIN_TIMEOUT_S", 0.5)
    add_node(api, "n1", 4)
    offered = {"m0": 30.0, "m1": 30.0}
    t0 = asyncio.get_running_loop().time()

    async def stats(_: web.Request) -> web.Response:
        up = asyncio.get_running_loop().time() - t0
        models = {
            m: {"requests": {"slo_met": int(rps * up)}, "workers": 1, "busy_seconds": 0.0}
            for m, rps in offered.items()
        }
        return web.json_response({"instance": "gw-1", "uptime_s": up, "models": models})

    app = web.Application()
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    seen: list[str] = []

    def url(ns: str, name: str) -> str:
        seen.append(name)
        return f"http://127.0.0.1:{port}"

    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments"
    try:
        async with running_operator(api, serving_stats_interval_s=0.5, gateway_url=url) as ctl:
            await wait_for(lambda: len(ctl.view.nodes) == 1, what="the node in the view")
            for name, rps in offered.items():
                await api.post(path, json=member(name, rps))
            await wait_for(lambda: len(events(api, "PoolPlanned")) >= 1, what="a first plan")
            first = len(events(api, "PoolPlanned"))
            st = await wait_for(
                lambda: (s := status_of(api, MDS, "m1")).get("observedLoadRps") and s,
                what="m1's observed load",
            )
            assert st["observedLoadRps"] == pytest.approx(30, rel=0.2)
            offered["m1"] = 31.5  # inside the band
            offered["m0"] = 60.0
            await wait_for(
                lambda: any(
                    re.search(r"m0: rate [\d.]+ → ", e["message"]) for e in events(api, "PoolPlanned")[first:]
                ),
                what="a re-plan for m0's observed load",
            )
            msgs = [e["message"] for e in events(api, "PoolPlanned")[first:]]
            assert not any("m1: rate" in m for m in msgs), msgs
            assert "web-pool" in seen  # read at the pool's gateway
            got = await wait_for(
                lambda: (s := status_of(api, MDS, "m0")).get("observedLoadRps", 0) > 45 and s,
                what="m0's observed load in status",
            )
            assert got["pool"] == "web"
    finally:
        await runner.cleanup()
