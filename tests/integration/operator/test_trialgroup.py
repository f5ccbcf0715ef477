"""TrialGroup: packed lanes and multi-GPU gangs exactly as Fluid's water-filling gives them, re-planned
(widths grow) when trials finish; invalid groups; deletion. Against kmock, asserting on what reached the API.

Worked example (Fluid Algorithm 3.1 line 3: w_i = min(max(⌊h_i/Σh · n⌋, 1/c), d)):
h = (600, 100, 100, 100) s, n = 3 GPUs, c = 3, d = n = 3 → A: ⌊600/900·3⌋ = 2 GPUs; B, C, D: ⌊100/900·3⌋
= 0 → 1/3 of a GPU each, packed on the third GPU with 16384 // 3 = 5461 MiB and 100 // 3 = 33 % of its SMs.
When B, C and D finish, DynamicFluid (Alg. 3.2, ε = 0) gives A ⌊600/600·3⌋ = 3 GPUs (scale-up: 600/3 < 600/2).
"""

from __future__ import annotations

import json
from typing import Any

import kmock
from tessera.api import contract

from .conftest import (
    NS,
    TGS,
    add_node,
    events,
    pods,
    running_operator,
    set_pod_phase,
    status_of,
    tg_body,
    trial,
    wait_for,
)


def placement(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][contract.ANN_PLACEMENT])


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return pod["spec"]["containers"][0]["resources"]["limits"]


def by_trial(k: kmock.KubernetesEmulator) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for body in pods(k, **{contract.LABEL_TRIALGROUP: "tg"}).values():
        if body.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out.setdefault(body["metadata"]["labels"][contract.LABEL_TRIAL], []).append(body)
    return out


GROUP = [trial("a", 600, lr=0.1), trial("b", 100), trial("c", 100), trial("d", 100)]


async def test_packed_and_multi_gpu_trials_then_replan_when_trials_finish(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 4)
    api.objects[TGS, NS, "tg"] = tg_body("tg", GROUP, gpus=3, fluid={"maxPackPerGPU": 3})
    async with running_operator(api):
        got = await wait_for(lambda: len(by_trial(api)) == 4 and by_trial(api), what="trial pods")
        a = got["a"]
        assert len(a) == 1 and placement(a[0]) == {"node": "n1", "gpuIndices": [0, 1]}
        assert limits(a[0]) == {contract.RESOURCE_GPU: "2"}
        env = {e["name"]: e["value"] for e in a[0]["spec"]["containers"][0]["env"]}
        assert env[contract.ENV_TRIAL] == "a" and json.loads(env[contract.ENV_TRIAL_CONFIG]) == {"lr": 0.1}
        for name in ("b", "c", "d"):
            (pod,) = got[name]
            assert placement(pod) == {"node": "n1", "gpuIndices": [2]}
            assert limits(pod) == {
                contract.RESOURCE_GPU: "1",
                contract.RESOURCE_GPU_MEMORY: "5461",
                contract.RESOURCE_GPU_COMPUTE: "33",
            }
            assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
            assert pod["metadata"]["annotations"][contract.ANN_WORKLOAD].startswith("trial")
            assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-tg"
        st = await wait_for(
            lambda: status_of(api, TGS, "tg").get("trialsRunning") == 4 and status_of(api, TGS, "tg")
        )
        widths = {t["name"]: t["width"] for t in st["trials"]}
        assert widths == {"a": 2.0, "b": 1 / 3, "c": 1 / 3, "d": 1 / 3}
        assert {t["placement"]["packSlot"] for t in st["trials"] if t["name"] != "a"} == {0, 1, 2}
        assert st["gpus"] == 3 and st["estimatedMakespanSeconds"] == 300.0
        pool = json.loads(dict(api.objects[TGS, NS, "tg"])["metadata"]["annotations"][contract.ANN_GPU_POOL])
        assert pool == ["n1/0", "n1/1", "n1/2"]

        old_a = a[0]["metadata"]["name"]
        await set_pod_phase(
            api,
            got["a"][0]["metadata"]["name"],
            "Running",
            **{contract.ANN_PROGRESS: '{"iterations": 300, "loss": 0.42}'},
        )
        for name in ("b", "c", "d"):
            report = json.dumps({"iterations": 100, "loss": 0.9})
            await set_pod_phase(
                api, got[name][0]["metadata"]["name"], "Succeeded", **{contract.ANN_PROGRESS: report}
            )
        new = await wait_for(
            lambda: (p := by_trial(api).get("a")) and p[0]["metadata"]["name"] != old_a and p, what="re-plan"
        )
        assert placement(new[0]) == {"node": "n1", "gpuIndices": [0, 1, 2]}
        assert limits(new[0]) == {contract.RESOURCE_GPU: "3"}
        st = await wait_for(
            lambda: status_of(api, TGS, "tg").get("trialsDone") == 3 and status_of(api, TGS, "tg")
        )
        trials = {t["name"]: t for t in st["trials"]}
        assert trials["a"]["width"] == 3.0 and trials["a"]["iterationsDone"] == 300
        assert trials["a"]["h1Seconds"] == 300.0 and st["estimatedMakespanSeconds"] == 100.0
        assert all(trials[n]["phase"] == "Completed" for n in ("b", "c", "d"))
        # results collected from the progress reports (the metric stays after a's pod is re-created)
        assert trials["a"]["result"] == 0.42 and all(trials[n]["result"] == 0.9 for n in ("b", "c", "d"))
        assert "scale-up: 1" in st["lastReallocation"]["rule"]
        await wait_for(lambda: old_a not in pods(api), what="old pod of a deleted")
        # Events are posted in the background, after the status.
        await wait_for(
            lambda: len(events(api, "TrialCompleted")) == 3 and events(api, "Planned"), what="the events"
        )


async def test_invalid_trialgroup_gets_condition_event_and_no_pods(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    api.objects[TGS, NS, "bad"] = tg_body("bad", [trial("x", 10), trial("x", 20)])
    async with running_operator(api):
        st = await wait_for(
            lambda: status_of(api, TGS, "bad").get("phase") == "Failed" and status_of(api, TGS, "bad")
        )
        ev = await wait_for(lambda: events(api, "InvalidSpec"), what="event")
    assert "spec.trials" in st["conditions"][0]["message"] and "unique" in ev[0]["message"]
    assert not pods(api)


async def test_trialgroup_waits_for_gpus_then_deletion_cleans_up(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    api.objects[TGS, NS, "big"] = tg_body("big", [trial("x", 10)], gpus=3)
    api.objects[TGS, NS, "tg"] = tg_body("tg", [trial("x", 10), trial("y", 10)], gpus=2)
    async with running_operator(api):
        await wait_for(lambda: len(pods(api, **{contract.LABEL_TRIALGROUP: "tg"})) == 2, what="tg pods")
        st = await wait_for(
            lambda: status_of(api, TGS, "big").get("conditions") and status_of(api, TGS, "big")
        )
        assert st["conditions"][0]["reason"] == "WaitingForGPUs"
        assert not pods(api, **{contract.LABEL_TRIALGROUP: "big"})
        await api.delete(f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/trialgroups/tg")
        await wait_for(lambda: (TGS, NS, "tg") not in api.objects, what="TrialGroup gone")
        await wait_for(lambda: not pods(api, **{contract.LABEL_TRIALGROUP: "tg"}), what="pods deleted")
