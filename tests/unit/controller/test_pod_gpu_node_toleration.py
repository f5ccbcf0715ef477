"""Every pod the operator creates goes through tessera-scheduler with the toleration of the GPU-node taint
(chart value gpuNodes.reserve), so reserved GPU nodes take it; its own tolerations are kept."""

from __future__ import annotations

from tessera.api import contract
from tessera.controller.pods import Owner, PodPlan, build_pod
from tessera.controller.serving import gateway_manifests

PLAN = PodPlan(node="n1", gpu_indices=(0,), labels={}, env={}, workload="training", base="a-j1")
OWNER = Owner("App", "a", "ml", "uid-a")
OWN = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


def test_worker_pods_tolerate_reserved_gpu_nodes_once() -> None:
    tmpl = {"spec": {"containers": [{"name": "main", "image": "x"}], "tolerations": [OWN]}}
    pod = build_pod(tmpl, PLAN, OWNER, "best-effort")
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert pod["spec"]["tolerations"] == [OWN, contract.gpu_node_toleration()]
    assert tmpl["spec"]["tolerations"] == [OWN]  # the template is not changed
    again = build_pod(pod, PLAN, OWNER, "best-effort")
    assert again["spec"]["tolerations"] == [OWN, contract.gpu_node_toleration()]


def test_gateway_pods_go_through_tessera_scheduler_with_the_toleration() -> None:
    meta = {"namespace": "ml", "labels": {"a": "b"}, "ownerReferences": []}
    objs = dict(
        gateway_manifests("m-gateway", meta, {"a": "b"}, "{}", "tessera:1", ("m-workers", {"c": "d"}))
    )
    spec = objs["deployments"]["spec"]["template"]["spec"]
    assert spec["schedulerName"] == contract.SCHEDULER_NAME
    assert spec["tolerations"] == [contract.gpu_node_toleration()]
