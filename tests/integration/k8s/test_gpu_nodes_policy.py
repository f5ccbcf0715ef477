"""The chart's namespace routing for reserved GPU nodes (gpuNodes.reserve) on the real API server: its
MutatingAdmissionPolicy and binding, rendered by the real Helm engine and applied as they are, give a pod
created in a labelled namespace spec.schedulerName tessera-scheduler and the toleration of the agents'
taint, and leave pods elsewhere (unlabelled namespaces, the release's namespace, pods that name another
scheduler) as they were created.
"""

from __future__ import annotations

import secrets
from typing import Any

from tessera.api import contract

from .conftest import GPU_NODES_POLICY_KINDS, RELEASE_NS
from .controlplane import ControlPlane

LABEL = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}
TOLERATION = contract.gpu_node_toleration()


def new_namespace(cluster: ControlPlane, labels: dict[str, str] | None = None) -> str:
    name = f"r-{secrets.token_hex(4)}"
    status, body = cluster.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}
    )
    assert status == 201, body
    return name


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:1"}], **spec},
    }


def create(cluster: ControlPlane, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> Any:
    query = "?dryRun=All" if dry_run else ""
    status, out = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods{query}", body)
    assert status == 201, out.get("message", out) if isinstance(out, dict) else out
    return out


def test_the_policy_api_is_served_by_default(
    cluster: ControlPlane, gpu_nodes_policy: list[dict[str, Any]]
) -> None:
    # GA in Kubernetes 1.36 (KEP-3962): served by this API server with no feature gate or --runtime-config.
    assert {o["kind"] for o in gpu_nodes_policy} == GPU_NODES_POLICY_KINDS
    assert {o["apiVersion"] for o in gpu_nodes_policy} == {"admissionregistration.k8s.io/v1"}
    served = {r["name"] for r in cluster.get("/apis/admissionregistration.k8s.io/v1")["resources"]}
    assert {"mutatingadmissionpolicies", "mutatingadmissionpolicybindings"} <= served


def test_pods_of_a_labelled_namespace_go_to_tessera_scheduler_with_the_toleration(
    cluster: ControlPlane, gpu_nodes_policy: list[dict[str, Any]]
) -> None:
    ns = new_namespace(cluster, LABEL)
    try:
        plain = create(cluster, ns, pod("cpu-only"))
        assert plain["spec"]["schedulerName"] == contract.SCHEDULER_NAME
        assert plain["spec"]["tolerations"].count(TOLERATION) == 1
        # Tolerations of its own are kept, the reservation's added after them.
        own = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
        kept = create(cluster, ns, pod("own-toleration", tolerations=[own]))
        assert kept["spec"]["tolerations"][0] == own and TOLERATION in kept["spec"]["tolerations"]
        # A pod that already tolerates the taint gets no second toleration.
        again = create(cluster, ns, pod("tolerates", tolerations=[TOLERATION]))
        assert again["spec"]["tolerations"].count(TOLERATION) == 1
        assert again["spec"]["schedulerName"] == contract.SCHEDULER_NAME
        # A pod naming another scheduler is that scheduler's.
        other = create(cluster, ns, pod("other", schedulerName="volcano"))
        assert other["spec"]["schedulerName"] == "volcano"
        assert TOLERATION not in other["spec"].get("tolerations", [])
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def test_pods_elsewhere_are_left_as_created(
    cluster: ControlPlane, gpu_nodes_policy: list[dict[str, Any]]
) -> None:
    ns = new_namespace(cluster)
    try:
        plain = create(cluster, ns, pod("cpu-only"))
        assert plain["spec"]["schedulerName"] == "default-scheduler"
        assert TOLERATION not in plain["spec"].get("tolerations", [])
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
    # The release's namespace, even labelled: the scheduler's own pod must not wait for itself.
    cluster.kubectl("create", "namespace", RELEASE_NS, check=False)
    cluster.kubectl(
        "label", "--overwrite", "namespace", RELEASE_NS, f"{contract.LABEL_GPU_NODES_NAMESPACE}=true"
    )
    try:
        own = create(cluster, RELEASE_NS, pod("scheduler-like"), dry_run=True)
        assert own["spec"]["schedulerName"] == "default-scheduler"
    finally:
        cluster.kubectl("label", "namespace", RELEASE_NS, f"{contract.LABEL_GPU_NODES_NAMESPACE}-")
