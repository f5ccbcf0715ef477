"""The chart's namespace routing for reserved GPU nodes (gpuNodes.reserve) on the real API server: its
MutatingAdmissionPolicy and binding, rendered by the real Helm engine and applied as they are, give a pod
created in a labelled namespace spec.schedulerName tessera-scheduler and the toleration of the agents'
taint, and leave pods elsewhere (unlabelled namespaces, the release's namespace, pods that name another
scheduler) as they were created.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tessera.api import contract

from .conftest import RELEASE_NS, chart_objects
from .controlplane import ControlPlane, wait_until

POLICY_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
LABEL = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}
TOLERATION = contract.gpu_node_toleration()


def policy_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    objs = chart_objects({"gpuNodes": {"reserve": True, **(values or {})}})
    return [o for o in objs if o["kind"] in POLICY_KINDS]


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


def routed(p: dict[str, Any]) -> bool:
    spec = p["spec"]
    return bool(
        spec["schedulerName"] == contract.SCHEDULER_NAME and TOLERATION in spec.get("tolerations", [])
    )


@pytest.fixture(scope="module")
def routing(cluster: ControlPlane) -> Iterator[list[dict[str, Any]]]:
    """The chart's policy and binding applied; waits until the API server enforces them (it loads policies
    through an informer, so the first pods after the apply may pass unchanged)."""
    objs = policy_objects()
    assert {o["kind"] for o in objs} == POLICY_KINDS
    manifest = "\n---\n".join(yaml.safe_dump(o) for o in objs)
    applied = cluster.kubectl("apply", "-f", "-", stdin=manifest, check=False)
    assert applied.returncode == 0, applied.stderr
    probe = new_namespace(cluster, LABEL)
    try:
        wait_until(
            lambda: routed(create(cluster, probe, pod("probe"), dry_run=True)),
            120,
            "the MutatingAdmissionPolicy to take effect",
        )
        yield objs
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{probe}")
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifest)


def test_the_policy_api_is_served_by_default(cluster: ControlPlane, routing: list[dict[str, Any]]) -> None:
    # GA in Kubernetes 1.36 (KEP-3962): served by this API server with no feature gate or --runtime-config.
    assert {o["apiVersion"] for o in routing} == {"admissionregistration.k8s.io/v1"}
    served = {r["name"] for r in cluster.get("/apis/admissionregistration.k8s.io/v1")["resources"]}
    assert {"mutatingadmissionpolicies", "mutatingadmissionpolicybindings"} <= served


def test_pods_of_a_labelled_namespace_go_to_tessera_scheduler_with_the_toleration(
    cluster: ControlPlane, routing: list[dict[str, Any]]
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


def test_pods_elsewhere_are_left_as_created(cluster: ControlPlane, routing: list[dict[str, Any]]) -> None:
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
