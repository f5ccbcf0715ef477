"""DRA mode (`lanes_api="dra"`, issue 30): the pods of an App, a TrialGroup and a ModelDeployment get their
lanes as ResourceClaimTemplates whose requests select exactly the GPUs the policy chose, by UUID, with the
lane's capacity; the pod names its template's claim, is pinned to the node by affinity and asks for no
extended resources; a template is deleted with its pod. Against kmock, asserting on what reached the API."""

from __future__ import annotations

import json
from typing import Any

import kmock
import pytest
from tessera.api import contract
from tessera.controller.dra import CLAIM, uuid_selector

from .conftest import (
    ALL,
    APPS,
    MDS,
    NS,
    TGS,
    ManualClock,
    add_node,
    app_body,
    job,
    md_body,
    pods,
    running_operator,
    status_of,
    tg_body,
    trial,
    wait_for,
)

TEMPLATES = "resource.k8s.io/v1/resourceclaimtemplates"


@pytest.fixture
def dra_api(api: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    api.resources[TEMPLATES] = kmock.ResourceInfo(kind="ResourceClaimTemplate", namespaced=True, verbs=ALL)
    return api


def templates(k: kmock.KubernetesEmulator) -> dict[str, dict[str, Any]]:
    return {
        name: dict(obj)
        for (res, _ns, name), obj in list(k.objects.items())
        if dict(obj).get("kind") == "ResourceClaimTemplate"
    }


def placement(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][contract.ANN_PLACEMENT])


def expected_requests(node: str, indices: list[int], capacity: dict[str, str] | None) -> list[dict[str, Any]]:
    out = []
    for i in indices:
        exactly: dict[str, Any] = {
            "deviceClassName": contract.DRA_DEVICE_CLASS,
            "selectors": [{"cel": {"expression": uuid_selector(f"GPU-{node}-{i}")}}],
        }
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        out.append({"name": f"gpu-{i}", "exactly": exactly})
    return out


def check_pod_and_template(
    k: kmock.KubernetesEmulator, pod: dict[str, Any], capacity: dict[str, str] | None, owner_uid: str
) -> None:
    """The pod names the claim of the template called as itself, which selects its placed GPUs."""
    name, spec = pod["metadata"]["name"], pod["spec"]
    where = placement(pod)
    assert spec["resourceClaims"] == [{"name": CLAIM, "resourceClaimTemplateName": name}]
    main = spec["containers"][0]
    assert main["resources"] == {"claims": [{"name": CLAIM}]}  # no tessera.io/gpu: no extender involved
    assert "schedulerName" not in spec  # the default scheduler, whose DRA allocator honours the selectors
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [where["node"]]}]}
        ]
    }
    template = templates(k)[name]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    assert template["metadata"]["ownerReferences"][0]["uid"] == owner_uid
    assert template["metadata"]["labels"] == pod["metadata"]["labels"]
    requests = template["spec"]["spec"]["devices"]["requests"]
    assert requests == expected_requests(where["node"], where["gpuIndices"], capacity)


async def test_app_job_pods_claim_the_leased_gpus_and_a_moved_lease_takes_its_template_along(
    dra_api: kmock.KubernetesEmulator,
) -> None:
    k = dra_api
    clock = ManualClock()
    add_node(k, "n1", 2)
    k.objects[APPS, NS, "a"] = app_body("a", [job("j1", iters=100000, gpus=2)])
    async with running_operator(k, lanes_api="dra", clock=clock, lease_s=100.0, fairness_knob=0.0):
        (first,) = (
            await wait_for(lambda: pods(k, **{contract.LABEL_APP: "a"}), what="A's pod on both GPUs")
        ).values()
        assert placement(first) == {"node": "n1", "gpuIndices": [0, 1]}
        check_pod_and_template(k, first, None, "uid-a")  # whole GPUs: no capacity requests

        # B arrives; at A's lease expiry the auction splits the GPUs: A's old pod and its template go.
        await k.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/apps",
            json=app_body("b", [job("j1", iters=100000, gpus=1)]),
        )
        await wait_for(lambda: status_of(k, APPS, "b").get("phase") == "Pending", what="B waiting")
        clock.advance(101)
        old = first["metadata"]["name"]
        b_pod = await wait_for(
            lambda: next(iter(pods(k, **{contract.LABEL_APP: "b"}).values()), None), what="B's pod"
        )
        check_pod_and_template(k, b_pod, None, "uid-b")
        await wait_for(lambda: old not in templates(k), what="A's old template deleted with its pod")
        a_pods = await wait_for(
            lambda: [p for n, p in pods(k, **{contract.LABEL_APP: "a"}).items() if n != old],
            what="A's successor pod",
        )
        for pod in a_pods:
            check_pod_and_template(k, pod, None, "uid-a")
        assert {placement(p)["gpuIndices"][0] for p in [*a_pods, b_pod]} == {0, 1}
        assert status_of(k, APPS, "a").get("phase") == "Running"


async def test_packed_trials_claim_their_lane_of_the_planned_gpu(dra_api: kmock.KubernetesEmulator) -> None:
    k = dra_api
    add_node(k, "n1", 4)
    group = [trial("a", 600), trial("b", 100), trial("c", 100), trial("d", 100)]
    k.objects[TGS, NS, "tg"] = tg_body("tg", group, gpus=3, fluid={"maxPackPerGPU": 3})
    async with running_operator(k, lanes_api="dra"):
        got = await wait_for(
            lambda: len(ps := pods(k, **{contract.LABEL_TRIALGROUP: "tg"})) == 4 and ps, what="trial pods"
        )
        for pod in got.values():
            trial_name = pod["metadata"]["labels"][contract.LABEL_TRIAL]
            if trial_name == "a":  # two whole GPUs (Fluid's ⌊600/900 · 3⌋)
                assert placement(pod)["gpuIndices"] == [0, 1]
                check_pod_and_template(k, pod, None, "uid-tg")
            else:  # a third of GPU 2 each: the lane as the claim's consumable capacity
                assert placement(pod)["gpuIndices"] == [2]
                check_pod_and_template(k, pod, {"memory": "5461Mi", "computeShare": "33"}, "uid-tg")
        assert len(templates(k)) == 4


async def test_serving_workers_claim_their_lane_of_the_replica_gpu(dra_api: kmock.KubernetesEmulator) -> None:
    k = dra_api
    add_node(k, "n1", 2)
    async with running_operator(k, lanes_api="dra") as ctl:
        await wait_for(lambda: ctl.view.nodes, what="the node in the view")
        await k.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments",
            json=md_body("m", 300),
        )
        got = await wait_for(
            lambda: (
                len(ws := pods(k, **{contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "worker"}))
                == 2
                and ws
            ),
            what="two workers",
        )
        st = await wait_for(lambda: status_of(k, MDS, "m").get("groups") and status_of(k, MDS, "m"))
        for pod in got.values():
            assert pod["spec"]["subdomain"] == "m-workers"  # the serving template's own fields stay
            check_pod_and_template(k, pod, {"memory": "4096Mi", "computeShare": "50"}, "uid-m")
        placed = sorted(f"{placement(p)['node']}/{placement(p)['gpuIndices'][0]}" for p in got.values())
        assert placed == sorted(st["groups"])
