"""Restarting the operator mid-flight: a TrialGroup keeps its GPU pool and Fluid widths, a ModelDeployment
keeps its replicas and their GPUs, and no pod is created twice. State is recovered from what the first
operator wrote (status, the pool annotation, the pods), not from memory. Against kmock."""

from __future__ import annotations

from typing import Any

import kmock
from tessera.api import contract

from .conftest import (
    MDS,
    NS,
    PODS,
    TGS,
    add_node,
    md_body,
    pods,
    running_operator,
    status_of,
    tg_body,
    trial,
    wait_for,
)


def posted_pods(k: kmock.KubernetesEmulator) -> list[str]:
    return [
        r.data["metadata"]["name"]
        for r in k
        if r.method == "POST" and r.resource and r.resource.plural == "pods"
    ]


def deleted_pods(k: kmock.KubernetesEmulator) -> list[str]:
    return [str(r.name) for r in k if r.method == "DELETE" and r.resource and r.resource.plural == "pods"]


def kept(st: dict[str, Any], *fields: str) -> dict[str, Any]:
    return {f: st.get(f) for f in fields}


async def test_trialgroup_restart_keeps_pool_and_widths_without_duplicates(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 4)
    group = [trial("a", 600), trial("b", 100), trial("c", 100), trial("d", 100)]
    api.objects[TGS, NS, "tg"] = tg_body("tg", group, gpus=3, fluid={"maxPackPerGPU": 3})
    async with running_operator(api) as ctl:
        await wait_for(lambda: len(pods(api, **{contract.LABEL_TRIALGROUP: "tg"})) == 4, what="trial pods")
        st = await wait_for(
            lambda: len(status_of(api, TGS, "tg").get("trials") or []) == 4 and status_of(api, TGS, "tg")
        )
        assert ctl.trialgroups is not None
        replans = ctl.trialgroups.replans
        names = set(pods(api))
    pool = dict(api.objects[TGS, NS, "tg"])["metadata"]["annotations"][contract.ANN_GPU_POOL]
    async with running_operator(api) as ctl2:
        # resume + several timer passes over the recovered group
        await wait_for(
            lambda: ctl2.trialgroups is not None and ctl2.trialgroups.reconciles >= 5, what="passes"
        )
        assert ctl2.trialgroups is not None
        assert ctl2.trialgroups.replans == 0  # nothing changed, so Fluid is not asked again
        assert set(pods(api)) == names
        after = status_of(api, TGS, "tg")
    assert dict(api.objects[TGS, NS, "tg"])["metadata"]["annotations"][contract.ANN_GPU_POOL] == pool
    assert replans >= 1
    widths = {t["name"]: t.get("width") for t in st["trials"]}
    assert widths["a"] == 2 and all(abs(widths[t] - 1 / 3) < 1e-6 for t in "bcd")  # Fluid's worked example
    assert {t["name"]: t.get("width") for t in after["trials"]} == widths
    assert kept(after, "gpus", "phase") == kept(st, "gpus", "phase")
    # Creates the restarted operator sent before its pod watch listed were answered 409 (same names).
    assert set(posted_pods(api)) == names and not deleted_pods(api)


async def test_modeldeployment_restart_keeps_replicas_without_duplicates(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 4)
    add_node(api, "n2", 4)
    api.objects[MDS, NS, "m"] = md_body("m", 300)
    async with running_operator(api):
        await wait_for(lambda: status_of(api, MDS, "m").get("replicas") == 2, what="2 replicas")
        await wait_for(lambda: len(pods(api, **{contract.LABEL_MODELDEPLOYMENT: "m"})) == 2, what="2 workers")
        st = status_of(api, MDS, "m")
        names = set(pods(api))
    async with running_operator(api) as ctl2:
        await wait_for(
            lambda: ctl2.deployments is not None and ctl2.deployments.reconciles >= 5, what="passes"
        )
        assert set(pods(api)) == names
        after = status_of(api, MDS, "m")
    assert kept(after, "replicas", "groups", "gpusAssigned") == kept(st, "replicas", "groups", "gpusAssigned")
    assert set(posted_pods(api)) == names and not deleted_pods(api)
    assert all(
        dict(o).get("kind") != "Pod" or name in names
        for (res, _ns, name), o in api.objects.items()
        if res == PODS
    )
