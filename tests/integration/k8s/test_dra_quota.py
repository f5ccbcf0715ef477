"""What Kubernetes' own ResourceQuota makes of DRA lanes on the real API server: it counts a namespace's claims
and the devices they request per DeviceClass, not their memory or compute share (docs/dra.md, "Quotas")."""

from __future__ import annotations

from typing import Any

from tessera.api import contract

from .controlplane import ControlPlane, wait_until

RESOURCE_API = "/apis/resource.k8s.io/v1"
DEVICES = f"{contract.DRA_DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"


def lane_claim(name: str, share: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": contract.DRA_DEVICE_CLASS,
                "capacity": {"requests": {"memory": "4Gi", "computeShare": share}}}}]}}}  # fmt: skip


def test_a_device_quota_counts_each_lane_as_a_whole_gpu(cluster: ControlPlane, namespace: str) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
             "spec": {"hard": {DEVICES: "1"}}}  # fmt: skip
    status, body = cluster.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", quota)
    assert status == 201, body
    wait_until(
        lambda: (
            (cluster.get(f"/api/v1/namespaces/{namespace}/resourcequotas/gpus") or {})
            .get("status", {})
            .get("hard")
        ),
        90,
        "the quota controller to take up the quota",
    )
    claims = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    status, body = cluster.request("POST", claims, lane_claim("a", "10"))
    assert status == 201, body
    # a second lane of 10 %: one GPU could hold ten of them, the quota counts devices and refuses it
    status, body = cluster.request("POST", claims, lane_claim("b", "10"))
    assert status == 403, body
    assert "exceeded quota" in body["message"] and DEVICES in body["message"], body["message"]
