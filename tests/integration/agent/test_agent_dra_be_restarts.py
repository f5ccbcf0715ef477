"""The BE feedback loop's restarts of DRA claims' pods (issue 39), against a real HTTP API server for the pods
(kmock's KubernetesEmulator) and `FakeDraApi` for the claims: before the pod restarter's own checks (UID
precondition, checkpoints annotation, not latency-critical, minimum interval), the claim is read again and must
still be the one prepared here, reserved for the pod, best-effort, and have taken the new BE share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
from tessera.kube import KubeClient, KubeConfig
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.backend import usable_memory_mib
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_feedback import ClaimPodRestarter
from tessera_agent.kubelet.dra_plugin import DraServicer
from tessera_agent.lanes.book import LaneBook, PodLane
from tessera_agent.lanes.restarts import KubernetesPodRestarter, RestartRefused

from .test_agent_be_restarts import EVENTS, PODS, Clock, deletes, seed
from .test_agent_dra import NODE, FakeDraApi, claim, result
from .test_agent_dra_lanes import lane_config


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    kmock.resources[PODS] = kmock.ResourceInfo(
        kind="Pod", namespaced=True, verbs={"list", "watch", "get", "patch", "create", "delete"}
    )
    kmock.resources[EVENTS] = kmock.ResourceInfo(
        kind="Event", namespaced=True, verbs={"create", "list", "get"}
    )
    client = KubeClient(KubeConfig(str(kmock.url).rstrip("/")))
    yield client
    await client.close()


@pytest.fixture
def servicer(plugin_dir: Path) -> DraServicer:
    cfg = AgentConfig(
        node_name=NODE,
        lanes_api="dra",
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        hp_be_lanes=True,
    )
    backend = FakeGpuBackend.uniform(1)
    book = LaneBook({g.uuid: usable_memory_mib(g) for g in backend.gpus()})
    return DraServicer(cfg, backend, FakeDraApi(), lanes=book)


def api_of(s: DraServicer) -> FakeDraApi:
    assert isinstance(s.api, FakeDraApi)
    return s.api


def lane(s: DraServicer, pod: str = "train", claim_uid: str | None = "claim-train") -> PodLane:
    (gpu,) = s.lanes.usable_mib if s.lanes is not None else ()
    return PodLane(f"uid-{pod}", f"ml/{pod}", gpu, "BE", 4096, 50, True, claim=claim_uid)


async def test_a_claims_pod_is_restarted_only_while_its_claim_is_its_best_effort_lane(
    kmock: kmock.KubernetesEmulator, kube: KubeClient, servicer: DraServicer
) -> None:
    s, api = servicer, api_of(servicer)
    seed(kmock, "train", "training:best-effort", checkpoints=True)
    api.claims[("ml", "train")] = claim("train", "claim-train", [result("gpu-0", "4Gi", "50")], pod="train")
    await s.prepare("ml", "train", "claim-train")
    restarter = ClaimPodRestarter(KubernetesPodRestarter(kube, min_interval_s=300, clock=Clock()), s)

    async def refused(match: str, pod_lane: PodLane | None = None) -> None:
        with pytest.raises(RestartRefused, match=match):
            await restarter.restart(pod_lane or lane(s), "share 50% -> 25%")
        assert deletes(kmock) == []

    await refused("runs in no claim's lane", lane(s, claim_uid=None))
    await refused(
        "its claim claim-other is no longer prepared on this node", lane(s, claim_uid="claim-other")
    )
    # The claim as the API server has it now, not as it was prepared:
    good = api.claims[("ml", "train")]
    api.claims[("ml", "train")] = claim("train", "claim-train", [result("gpu-0", "4Gi", "50")], pod="someone")
    await refused("its claim ml/train is no longer reserved for it")
    api.claims[("ml", "train")] = claim("train", "claim-new", [result("gpu-0", "4Gi", "50")], pod="train")
    await refused(r"its claim ml/train was replaced \(UID claim-new, lane claim-train\)")
    hp = claim("train", "claim-train", [result("gpu-0", "4Gi", "50")], pod="train")
    hp["status"]["allocation"]["devices"]["config"] = [lane_config("latency-critical")]
    api.claims[("ml", "train")] = hp
    await refused("its claim ml/train is latency-critical")
    del api.claims[("ml", "train")]
    await refused("cannot read its claim ml/train")

    # A claim the new share could not reach keeps its pod until it does.
    assert s.lanes is not None
    (gpu,) = s.lanes.usable_mib
    s.lanes.set_be_percent(gpu, 30)
    await s.apply_be_share(gpu, 30)
    api.claims[("ml", "train")] = good
    await refused(r"its claim ml/train could not be given the new share \(.*not found")
    await s.apply_be_share(gpu, 30)
    assert s.unshared == {}

    # The pod's own checks still apply: it must still say it checkpoints.
    seed(kmock, "train", "training:best-effort", checkpoints=False)
    await refused("does not say tessera.io/checkpoints")
    seed(kmock, "train", "training:best-effort", checkpoints=True)
    await restarter.restart(lane(s), "share 50% -> 30%")
    assert deletes(kmock) == ["train"]
    (delete,) = [r for r in kmock if r.method == "DELETE"]
    assert delete.data["preconditions"] == {"uid": "uid-train"}
