"""The BE feedback loop with DRA lanes (issue 39) under the agent's ServiceAccount of a release rendered with
`lanes.api: dra` and `agent.lanes.feedback`, on the real API server: the claim restarter reads a BE claim's
claim and pod again and deletes the pod (UID precondition), refuses the pod of a claim now latency-critical
after reading the claim, and writes events on the pods. No request is refused, and each is one the release
grants: resourceclaims get (the DRA driver's), pods get and delete and events create (the loop's)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_feedback import ClaimPodRestarter
from tessera_agent.kubelet.dra_plugin import RESOURCE_API, DraServicer, KubernetesDraApi, PreparedClaim
from tessera_agent.lanes.book import PodLane
from tessera_agent.lanes.restarts import KubernetesEventSink, KubernetesPodRestarter, RestartRefused

from tests.unit.chart.chart_render import objects, render

from .conftest import RBAC_KINDS, RELEASE_NS, Credentials, request_token, wait_for
from .controlplane import ControlPlane
from .test_rbac import Audit, agent_api, be_pod, call_of, forbidden, grants, sa_user

RELEASE = "tessera-dra-fb"
VALUES = {
    "lanes": {"api": "dra"},
    "agent": {"lanes": {"hpBe": True, "feedback": {"enabled": True}}, "progress": {"enabled": True}},
}
NODE = "dra-fb-node"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(
        tempfile.mkdtemp(prefix="tsf-", dir="/tmp")
    )  # the DRA socket paths it implies: at most 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def dra_feedback_rbac(crds: ControlPlane) -> tuple[list[dict[str, Any]], Credentials]:
    crds.kubectl("create", "namespace", RELEASE_NS, check=False)
    objs = objects(render(VALUES, name=RELEASE, namespace=RELEASE_NS))
    docs = [o for o in objs if o["kind"] in RBAC_KINDS and o["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "agent"]  # fmt: skip
    crds.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
    (sa,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    token = request_token(crds, RELEASE_NS, sa)
    path = crds.write_kubeconfig(crds.workdir / "agent-dra-feedback.kubeconfig", token=token)
    return objs, Credentials(sa, token, path)


def allocated_claim(
    cluster: ControlPlane, namespace: str, name: str, pod: dict[str, Any], lane_class: str | None
) -> dict[str, Any]:
    """A claim as the allocator and kube-scheduler leave it (written here as admin): allocated on NODE's
    GPU, reserved for `pod`, with the claim's LaneConfig copied into the allocation."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": contract.DRA_DEVICE_CLASS}}]
            }
        },
    }
    status, created = cluster.request("POST", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims", body)
    assert status == 201, created
    config = []
    if lane_class is not None:
        params = {"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "LaneConfig", "class": lane_class}
        config = [
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": contract.DRA_DRIVER, "parameters": params},
            }
        ]
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": contract.DRA_DRIVER, "pool": NODE, "device": "gpu-0"}
                ],
                "config": config,
            }
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }
    status, updated = cluster.request(
        "PUT", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}/status", created
    )
    assert status == 200, updated
    return dict(updated)


async def test_be_feedback_on_claims_uses_only_its_grants(
    cluster: ControlPlane,
    dra_feedback_rbac: tuple[list[dict[str, Any]], Credentials],
    namespace: str,
    short_dir: Path,
) -> None:
    objs, creds = dra_feedback_rbac
    pods, lanes = {}, {}
    for name, lane_class in (("train", None), ("serve", "latency-critical")):
        status, pod = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", be_pod(name, checkpoints=True)
        )
        assert status == 201, pod
        claim = allocated_claim(cluster, namespace, f"{name}-lane", pod, lane_class)
        pods[name] = pod
        lanes[name] = PodLane(
            pod["metadata"]["uid"],
            f"{namespace}/{name}",
            "GPU-0",
            "BE",
            1024,
            30,
            True,
            claim=claim["metadata"]["uid"],
        )
    cfg = AgentConfig(
        node_name=NODE,
        lanes_api="dra",
        mps_root=short_dir / "mps",
        kubelet_plugins_dir=short_dir / "plugins",  # the checkpoint's directory; no socket is served here
        kubelet_registry_dir=short_dir / "reg",
        cdi_dir=short_dir / "cdi",
    )
    api = agent_api(creds)
    backend = FakeGpuBackend([GpuDevice(0, "GPU-0", "A100", 40960 * MIB, 512 * MIB, minor=0)])
    servicer = DraServicer(cfg, backend, KubernetesDraApi(api))
    for name, ln in lanes.items():  # what NodePrepareResources recorded (the driver's own test covers it)
        assert ln.claim is not None
        servicer.checkpoint.claims[ln.claim] = PreparedClaim(
            namespace=namespace, name=f"{name}-lane", state="prepared", pod_uids=[ln.uid]
        )
    restarter = ClaimPodRestarter(KubernetesPodRestarter(api, min_interval_s=300), servicer)
    sink = KubernetesEventSink(api, NODE)
    audit = Audit(cluster, sa_user(creds.service_account))
    try:
        await restarter.restart(lanes["train"], "BE share 50% -> 25%")
        await sink.event(lanes["train"].pod, "BEComputeShareChanged", "BE share 50% -> 25%")
        with pytest.raises(RestartRefused, match=f"its claim {namespace}/serve-lane is latency-critical"):
            await restarter.restart(lanes["serve"], "BE share 50% -> 25%")
        await sink.event(lanes["serve"].pod, "BENotRestarted", "its claim is latency-critical", warning=True)
    finally:
        await api.close()

    def deleted() -> bool:
        got = cluster.get(f"/api/v1/namespaces/{namespace}/pods/train")
        return got is None or bool(got["metadata"].get("deletionTimestamp"))

    await wait_for(deleted, 60, "the BE claim's pod to be deleted")
    assert cluster.get(f"/api/v1/namespaces/{namespace}/pods/serve") is not None
    events = await wait_for(lambda: audit.events() if len(audit.events()) >= 6 else None, 30, "the audit log")
    assert forbidden(events) == []
    used = {call_of(e) for e in events}
    assert used == {
        ("resource.k8s.io", "resourceclaims", "get"),
        ("", "pods", "get"),
        ("", "pods", "delete"),
        ("", "events", "create"),
    }, used
    assert used <= grants(objs, creds.service_account)
