"""ModelDeployment through the operator (kmock): a data-dependent model is served by Orloj, with its
applications' priors, header and knobs in the gateway's ConfigMap; spec.scheduler.policy switches it to
Symphony and the gateway's config (and its rollout digest) follow."""

from __future__ import annotations

import json
from typing import Any

import kmock
import pytest
from tessera.api import contract
from tessera.gateway.config import GatewayConfig, build_scheduler
from tessera.policy.serving.orloj import OrlojScheduler
from tessera.policy.serving.symphony import SymphonyScheduler

from .conftest import MDS, NODES, NS, add_node, md_body, running_operator, wait_for

CONFIGMAPS = "v1/configmaps"
DEPLOYMENTS = "apps/v1/deployments"
PATH = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments"


def gateway_model(k: kmock.KubernetesEmulator) -> dict[str, Any] | None:
    try:
        cm = k.objects[CONFIGMAPS, NS, "m-gateway"]
    except KeyError:
        return None
    model: dict[str, Any] = json.loads(cm["data"]["gateway.json"])["models"][0]
    return model


def digest(k: kmock.KubernetesEmulator) -> str | None:
    try:
        dep = k.objects[DEPLOYMENTS, NS, "m-gateway"]
    except KeyError:
        return None
    return str(dep["spec"]["template"]["metadata"]["annotations"]["tessera.io/config-digest"])


async def test_dynamic_model_is_served_by_orloj_and_scheduler_policy_overrides(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 2)
    body = md_body(
        "m",
        50,
        model={"name": "bart", "dynamic": True},
        applications=[
            {"id": "news", "prior": {"parametric": {"type": "normal", "meanMs": 50, "stdMs": 5}}},
            {"id": "papers", "prior": {"parametric": {"type": "normal", "meanMs": 100, "stdMs": 5}}},
        ],
        frontend={"appIdHeader": "X-Tenant"},
        scheduler={"anticipatedDelayRatePerMs": 1e-3},
    )
    async with running_operator(api):
        await api.post(PATH, json=body)
        model = await wait_for(lambda: gateway_model(api), what="gateway config")
        before = await wait_for(lambda: digest(api), what="gateway Deployment")
        assert model["policy"] == "orloj" and sorted(model["priors"]) == ["news", "papers"]
        assert model["app_header"] == "x-tenant" and model["orloj"]["b"] == 1.0
        cfg = GatewayConfig.model_validate({"models": [model]}).models[0]
        sched = build_scheduler(cfg)
        assert isinstance(sched, OrlojScheduler) and sorted(sched.apps) == ["news", "papers"]

        await api.patch(f"{PATH}/m", json={"spec": {"scheduler": {"policy": "symphony"}}})
        model = await wait_for(
            lambda: (m := gateway_model(api)) is not None and m["policy"] == "symphony" and m,
            what="config switched to Symphony",
        )
        assert isinstance(
            build_scheduler(GatewayConfig.model_validate({"models": [model]}).models[0]), SymphonyScheduler
        )
        await wait_for(lambda: digest(api) != before, what="gateway rolled out with the new config")


def set_gpu_model(k: kmock.KubernetesEmulator, node: str, model: str) -> None:
    """add_node's GPUs are V100s; relabel one node's inventory (before the operator starts)."""
    obj = dict(k.objects[NODES, None, node])
    meta = dict(obj["metadata"])
    inv = json.loads(meta["annotations"][contract.ANN_NODE_GPUS])
    meta["annotations"] = {contract.ANN_NODE_GPUS: json.dumps([{**g, "model": model} for g in inv])}
    k.objects[NODES, None, node] = {**obj, "metadata": meta}


async def test_gpu_types_place_workers_and_pick_the_profile_the_gateway_plans_with(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 4)  # V100s
    add_node(api, "n2", 1)
    set_gpu_model(api, "n2", "a100")
    body = md_body(
        "m",
        0,
        replicas=2,
        batching={"supportedBatchSizes": [1, 2]},
        latencyProfiles=[
            {
                "gpuType": "V100",
                "points": [{"batchSize": 1, "latencyMs": 8}, {"batchSize": 2, "latencyMs": 12}],
            },
            {
                "gpuType": "a100",
                "points": [{"batchSize": 1, "latencyMs": 2}, {"batchSize": 2, "latencyMs": 3}],
            },
        ],
        placement={"gpuTypes": ["a100"], "minGPUs": 1, "maxGPUs": 4},
    )
    async with running_operator(api) as ctl:
        await wait_for(lambda: len(ctl.view.nodes) == 2, what="both nodes in the view")
        await api.post(PATH, json=body)
        model = await wait_for(lambda: gateway_model(api), what="gateway config")
        # ℓ(b) of the A100 profile: α = β = 1 ms (the V100's would give α = 4 ms, β = 4 ms).
        assert model["policy"] == "symphony"
        assert model["symphony"]["alpha"] == pytest.approx(0.001) and model["symphony"][
            "beta"
        ] == pytest.approx(0.001)
        st = await wait_for(
            lambda: (s := api.objects[MDS, NS, "m"].get("status") or {}).get("policy") and s,
            what="status written",
        )
        # Two replicas wanted, one A100 in the cluster: one placed, none on the V100 node.
        assert st["replicas"] == 1 and st["groups"] == ["n2/0"]
        assert st["sloLatencyMs"] == 100 and st["policy"] == "symphony"
        assert st["fittedAlphaMs"] == pytest.approx(1.0) and st["fittedBetaMs"] == pytest.approx(1.0)
        assert len(model["workers"]) == 1
