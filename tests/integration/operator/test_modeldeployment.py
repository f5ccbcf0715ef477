"""ModelDeployment: gateway Deployment + Service and worker pods on lanes; replicas follow the load.

Worked numbers: ℓ(b) = 10, 15, 25, 45 ms at b = 1, 2, 4, 8 and a 100 ms SLO. Batches that leave half the
SLO for queueing (ℓ ≤ 50 ms): the best is b = 8 at 8 / 45 ms = 177.8 rps per replica. 300 rps → ⌈1.69⌉ = 2
replicas; doubled to 600 rps → ⌈3.375⌉ = 4 replicas.
"""

from __future__ import annotations

import json
from typing import Any

import kmock
from tessera.api import contract

from .conftest import MDS, NS, add_node, events, md_body, pods, running_operator, status_of, wait_for

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"


def workers(k: kmock.KubernetesEmulator) -> dict[str, dict[str, Any]]:
    return pods(k, **{contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "worker"})


def get(k: kmock.KubernetesEmulator, res: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(k.objects[res, NS, name])
    except KeyError:
        return None


async def test_gateway_and_workers_on_lanes_then_scale_when_load_doubles(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 4)
    add_node(api, "n2", 4)
    async with running_operator(api) as ctl:
        # Nodes arrive as separate watch events: create the deployment once both are known, or a pass
        # that ran between them would (rightly) put both replicas on the one node it saw.
        await wait_for(lambda: len(ctl.view.nodes) == 2, what="both nodes in the view")
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments",
            json=md_body("m", 300),
        )
        got = await wait_for(lambda: len(workers(api)) == 2 and workers(api), what="2 workers")
        for pod in got.values():
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {
                contract.RESOURCE_GPU: "1",
                contract.RESOURCE_GPU_MEMORY: "4096",
                contract.RESOURCE_GPU_COMPUTE: "50",
            }
            assert pod["metadata"]["annotations"][contract.ANN_WORKLOAD] == "serving:latency-critical"
            assert pod["spec"]["subdomain"] == "m-workers"
        nodes = {
            json.loads(p["metadata"]["annotations"][contract.ANN_PLACEMENT])["node"] for p in got.values()
        }
        assert nodes == {"n1", "n2"}  # replicas spread over nodes
        # The gateway's objects are written one after another: wait for all of them, not the first.
        dep = await wait_for(
            lambda: (
                get(api, SERVICES, "m-gateway")
                and get(api, SERVICES, "m-workers")
                and get(api, CONFIGMAPS, "m-gateway")
                and get(api, DEPLOYMENTS, "m-gateway")
            ),
            what="gateway Deployment, Services and ConfigMap",
        )
        assert dep["apiVersion"] == "apps/v1" and dep["metadata"]["ownerReferences"][0]["uid"] == "uid-m"
        assert dep["spec"]["template"]["spec"]["containers"][0]["args"][0] == "gateway"
        config = json.loads(get(api, CONFIGMAPS, "m-gateway")["data"]["gateway.json"])
        model = config["models"][0]
        assert model["policy"] == "symphony" and len(model["workers"]) == 2 and model["slo_s"] == 0.1
        st = await wait_for(
            lambda: status_of(api, MDS, "m").get("replicas") == 2 and status_of(api, MDS, "m")
        )
        assert st["phase"] == "Serving" and st["gpusAssigned"] == 2 and st["sloLatencyMs"] == 100
        assert "300 rps" in st["conditions"][0]["message"]

        await api.patch(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/modeldeployments/m",
            json={"spec": {"traffic": {"expectedRps": 600}}},
        )
        await wait_for(lambda: len(workers(api)) == 4, what="4 workers")
        st = await wait_for(
            lambda: status_of(api, MDS, "m").get("replicas") == 4 and status_of(api, MDS, "m")
        )
        assert len(st["groups"]) == 4 and len(set(st["groups"])) == 4
        await wait_for(
            lambda: (
                len(
                    json.loads(get(api, CONFIGMAPS, "m-gateway")["data"]["gateway.json"])["models"][0][
                        "workers"
                    ]
                )
                == 4
            ),
            what="gateway config lists 4 workers",
        )
        assert events(api, "Scaled")


async def test_invalid_modeldeployment_gets_condition_and_no_pods(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    bad = md_body("bad", 10)
    bad["spec"]["slo"] = {}
    api.objects[MDS, NS, "bad"] = bad
    async with running_operator(api):
        st = await wait_for(
            lambda: status_of(api, MDS, "bad").get("phase") == "Failed" and status_of(api, MDS, "bad")
        )
        await wait_for(lambda: events(api, "InvalidSpec"), what="event")
    assert "spec.slo" in st["conditions"][0]["message"]
    assert not pods(api) and get(api, DEPLOYMENTS, "bad-gateway") is None
