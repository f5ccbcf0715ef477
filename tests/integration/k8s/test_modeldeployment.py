"""ModelDeployment end to end on a real control plane: the gateway's ConfigMap, Deployment and Services and
the worker pods on lanes, bound by the real kube-scheduler through the extender; replicas follow the load
the gateway reports in status.

Worked numbers (as tests/integration/operator/test_modeldeployment.py): ℓ(b) = 10, 15, 25, 45 ms at b = 1,
2, 4, 8 and a 100 ms SLO; the best batch within half the SLO is b = 8 at 8 / 45 ms = 177.8 rps per replica.
300 rps expected → ⌈1.69⌉ = 2 replicas; a reported goodput of 570 rps at 95 % SLO attainment is an offered
600 rps → ⌈3.375⌉ = 4 replicas.
"""

from __future__ import annotations

import json
from typing import Any

from tessera.api import contract

from .conftest import Credentials, Nodes, Scheduling, wait_for
from .controlplane import ControlPlane
from .workloads import (
    assignment_of,
    bound,
    call,
    cr_path,
    events,
    modeldeployment,
    operator,
    placement_of,
    pods_with,
    status_of,
)

LANE = {contract.RESOURCE_GPU: "1", contract.RESOURCE_GPU_MEMORY: "4096", contract.RESOURCE_GPU_COMPUTE: "50"}


def workers(cluster: ControlPlane, ns: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods_with(cluster, ns, contract.LABEL_MODELDEPLOYMENT, "m")
        if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "worker"
    ]


def gateway_config(cluster: ControlPlane, ns: str) -> dict[str, Any] | None:
    cm = cluster.get(f"/api/v1/namespaces/{ns}/configmaps/m-gateway")
    return json.loads(cm["data"]["gateway.json"]) if cm else None


async def test_gateway_and_workers_on_lanes_then_replicas_follow_the_reported_load(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    n1 = nodes.add(f"{namespace}-n1", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    n2 = nodes.add(f"{namespace}-n2", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    path = cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace, "m")
    # The gateway pod never runs here: the operator does not read it (serving_stats_interval_s 0) and the
    # test writes the figures into status as the reader would (tests/integration/gateway/
    # test_operator_stats_e2e.py reads a real gateway).
    async with operator(cluster, chart_rbac["operator"], namespace, serving_stats_interval_s=0) as ctl:
        # Both nodes in the view first, or a pass between their watch events would put both replicas on one.
        await wait_for(lambda: {n1, n2} <= set(ctl.view.nodes), 60, "both nodes in the operator's view")
        await call(
            cluster, "POST", cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace), modeldeployment("m", 300)
        )
        got = await wait_for(
            lambda: (w := workers(cluster, namespace)) and len(w) == 2 and bound(w) and w,
            120,
            "2 workers bound",
        )
        md = cluster.get(path)
        for pod in got:
            spec = pod["spec"]
            assert spec["schedulerName"] == contract.SCHEDULER_NAME and spec["subdomain"] == "m-workers"
            assert spec["containers"][0]["resources"]["limits"] == LANE
            assert pod["metadata"]["annotations"][contract.ANN_WORKLOAD] == "serving:latency-critical"
            assert pod["metadata"]["ownerReferences"][0]["uid"] == md["metadata"]["uid"]
            # Bound where the operator placed it, on a 4096 MiB / 50 % lane of the GPU it named.
            placement, assignment = placement_of(pod), assignment_of(pod)
            assert spec["nodeName"] == placement["node"] == assignment["node"]
            assert assignment["gpuIndices"] == placement["gpuIndices"]
            assert (assignment["memoryMiB"], assignment["computePercent"]) == (4096, 50)
        assert {p["spec"]["nodeName"] for p in got} == {n1, n2}  # replicas spread over nodes

        # The gateway's objects, as the API server stored them (defaults filled in, owner set).
        dep = await wait_for(
            lambda: cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/m-gateway"), 60, "gateway"
        )
        assert dep["metadata"]["ownerReferences"][0]["uid"] == md["metadata"]["uid"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["tessera"] and container["args"][:1] == ["gateway"]
        # gRPC beside HTTP (frontend.grpcPort, default 8001): the container's port and the Service's.
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "grpc": 8001}
        # The operator applies the gateway's objects one request at a time (ConfigMap, Deployment, Service,
        # workers' headless Service): the Deployment being there does not mean the Services are yet.
        gw_svc = await wait_for(
            lambda: cluster.get(f"/api/v1/namespaces/{namespace}/services/m-gateway"), 60, "gateway Service"
        )
        assert {p["name"]: (p["port"], p["targetPort"]) for p in gw_svc["spec"]["ports"]} == {
            "http": (80, 8080),
            "grpc": (8001, 8001),
        }
        workers_svc = await wait_for(
            lambda: cluster.get(f"/api/v1/namespaces/{namespace}/services/m-workers"), 60, "workers Service"
        )
        assert gw_svc["spec"]["clusterIP"] not in ("", "None") and workers_svc["spec"]["clusterIP"] == "None"
        config = gateway_config(cluster, namespace)
        assert config is not None and config["grpc_port"] == 8001
        model = config["models"][0]
        assert model["policy"] == "symphony" and model["slo_s"] == 0.1
        assert sorted(model["workers"]) == sorted(
            f"http://{p['metadata']['name']}.m-workers.{namespace}.svc:9001" for p in got
        )
        # The controller manager rolls the Deployment out: its gateway pod exists (no default scheduler
        # runs here, so it stays Pending), mounting the ConfigMap.
        gw_pods = await wait_for(
            lambda: [
                p
                for p in pods_with(cluster, namespace, contract.LABEL_MODELDEPLOYMENT, "m")
                if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "gateway"
            ],
            60,
            "the gateway Deployment's pod",
        )
        assert gw_pods[0]["spec"]["volumes"][0]["configMap"]["name"] == "m-gateway"
        st = await wait_for(
            lambda: (
                (s := status_of(cluster, contract.PLURAL_MODELDEPLOYMENT, namespace, "m")).get("replicas")
                == 2
                and s
            ),
            60,
            "status with 2 replicas",
        )
        assert st["phase"] == "Serving" and st["gpusAssigned"] == 2 and st["sloLatencyMs"] == 100
        revision = dep["metadata"]["generation"]

        # The gateway reports what it serves in status: 570 rps within the SLO at 95 % attainment.
        await call(
            cluster,
            "PATCH",
            path + "/status",
            {"status": {"goodputRps": 570, "sloAttainmentPercent": 95}},
            content_type="application/merge-patch+json",
        )
        got = await wait_for(
            lambda: (w := workers(cluster, namespace)) and len(w) == 4 and bound(w) and w,
            120,
            "4 workers bound",
        )
        assert {p["spec"]["nodeName"] for p in got}.issubset({n1, n2})
        st = await wait_for(
            lambda: (
                (s := status_of(cluster, contract.PLURAL_MODELDEPLOYMENT, namespace, "m")).get("replicas")
                == 4
                and s
            ),
            60,
            "status with 4 replicas",
        )
        assert st["observedLoadRps"] == 600 and len(set(st["groups"])) == 4
        assert st["goodputRps"] == 570  # the gateway's fields are kept beside the operator's
        await wait_for(
            lambda: len(gateway_config(cluster, namespace)["models"][0]["workers"]) == 4,  # type: ignore[index]
            60,
            "gateway config listing 4 workers",
        )
        # The new config reaches the gateway: its pod template changes, so the Deployment rolls out.
        await wait_for(
            lambda: (
                cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/m-gateway")["metadata"][
                    "generation"
                ]
                > revision
            ),
            60,
            "a gateway rollout",
        )
        assert events(cluster, namespace, "Scaled")


async def test_a_modeldeployment_whose_name_cannot_name_its_services_is_refused(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # `resnet.v2` is a valid object name but names no Service and no pod hostname (DNS labels): the API
    # server refused the worker pods and the gateway's Services, and every pass failed on them.
    nodes.add(f"{namespace}-n1", gpus=2, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    async with operator(cluster, chart_rbac["operator"], namespace):
        await call(
            cluster,
            "POST",
            cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace),
            modeldeployment("resnet.v2", 100),
        )
        st = await wait_for(
            lambda: (
                (s := status_of(cluster, contract.PLURAL_MODELDEPLOYMENT, namespace, "resnet.v2")).get(
                    "phase"
                )
                == "Failed"
                and s
            ),
            60,
            "the ModelDeployment refused",
        )
        (valid,) = [c for c in st["conditions"] if c["type"] == "Valid"]
        assert valid["status"] == "False" and valid["message"].startswith("metadata.name: must be at most 55")
        assert "the Service resnet.v2-gateway and the Service resnet.v2-workers" in valid["message"]
        await wait_for(lambda: events(cluster, namespace, "InvalidSpec"), 60, "an InvalidSpec event")
        assert not (cluster.get(f"/api/v1/namespaces/{namespace}/pods") or {}).get("items")
        assert not (cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments") or {}).get("items")


async def test_a_dynamic_model_is_served_by_orloj_and_the_policy_rules_hold_on_the_api_server(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # A data-dependent model with two applications' priors: the operator writes an Orloj gateway config
    # with the priors, and the API server's defaulting gives the header the gateway reads.
    nodes.add(f"{namespace}-n1", gpus=2, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    md = modeldeployment("m", 50)
    md["spec"]["model"] = {"name": "bart", "dynamic": True}
    md["spec"]["applications"] = [
        {"id": "news", "prior": {"samplesMs": [45, 50, 55]}},
        {"id": "papers", "prior": {"parametric": {"type": "normal", "meanMs": 100, "stdMs": 5}}},
    ]
    # scheduler.policy timeout without batching.timeoutMs: refused by the CRD's CEL rule.
    bad = json.loads(json.dumps(md))
    bad["metadata"]["name"] = "t"
    bad["spec"]["scheduler"] = {"policy": "timeout"}
    status, out = cluster.request("POST", cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace), bad)
    assert status == 422 and "scheduler.policy timeout needs batching.timeoutMs" in json.dumps(out)
    async with operator(cluster, chart_rbac["operator"], namespace):
        await call(cluster, "POST", cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace), md)
        cfg = await wait_for(lambda: gateway_config(cluster, namespace), 60, "the gateway's ConfigMap")
        model = cfg["models"][0]
        assert model["policy"] == "orloj" and sorted(model["priors"]) == ["news", "papers"]
        assert model["priors"]["news"] == [0.045, 0.05, 0.055]
        assert model["app_header"] == contract.HEADER_APP and model["default_app"] == "default"
        stored = cluster.get(cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace, "m"))
        assert stored["spec"]["frontend"]["appIdHeader"] == contract.HEADER_APP
        assert stored["spec"]["batching"]["getBatch"] == "earlyDropForTarget"

        await call(
            cluster,
            "PATCH",
            cr_path(contract.PLURAL_MODELDEPLOYMENT, namespace, "m"),
            {"spec": {"scheduler": {"policy": "timeout"}, "batching": {"timeoutMs": 5}}},
            content_type="application/merge-patch+json",
        )
        model = (
            await wait_for(
                lambda: (
                    (c := gateway_config(cluster, namespace)) and c["models"][0]["policy"] == "timeout" and c
                ),
                60,
                "the gateway's config switched to timeout batching",
            )
        )["models"][0]
        assert model["timeout"]["max_queue_delay_s"] == 0.005
