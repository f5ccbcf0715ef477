"""Fake NVML: the tessera.io/gpus annotation, per-lane metrics and over-limit detection (issue 7)."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import generate_latest
from tessera.api import contract
from tessera.api import metrics_catalog as catalog
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.gpus.inventory import InventoryPublisher
from tessera_agent.gpus.telemetry import LaneTelemetry, pod_uid_from_cgroup
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import pod_info_from_manifest

UID_A = "1f2e3d4c-0000-4000-8000-00000000000a"
UID_B = "1f2e3d4c-0000-4000-8000-00000000000b"


class RecordingPatcher:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, str]]] = []

    async def annotate(self, node: str, annotations: dict[str, str]) -> None:
        self.patches.append((node, annotations))


def backend() -> FakeGpuBackend:
    return FakeGpuBackend(
        [
            GpuDevice(
                0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 81559 * MIB, 527 * MIB
            ),
            GpuDevice(
                1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 81559 * MIB, 527 * MIB
            ),
        ]
    )


async def test_inventory_annotation_deducts_reserve_and_tracks_health() -> None:
    b = backend()
    patcher = RecordingPatcher()
    pub = InventoryPublisher("node-a", b, patcher, extra_reserve_mib=32)
    assert await pub.publish_if_changed()
    node, ann = patcher.patches[0]
    assert node == "node-a"
    assert json.loads(ann[contract.ANN_NODE_GPUS]) == [
        {
            "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
            "index": 0,
            "model": "NVIDIA H100 80GB HBM3",
            "memoryMiB": 81559 - 527 - 32,
            "healthy": True,
        },
        {
            "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000",
            "index": 1,
            "model": "NVIDIA H100 80GB HBM3",
            "memoryMiB": 81559 - 527 - 32,
            "healthy": True,
        },
    ]
    assert not await pub.publish_if_changed()  # unchanged: no API write
    b.inject_fault("GPU-bbbbbbbb-0000-0000-0000-000000000000")
    assert await pub.publish_if_changed()
    assert [g["healthy"] for g in json.loads(patcher.patches[-1][1][contract.ANN_NODE_GPUS])] == [True, False]
    assert len(patcher.patches) == 2


async def test_the_enforcing_mechanisms_are_published_beside_the_inventory_once() -> None:
    from tessera_agent.enforce.mechanism import mechanisms

    b = backend()
    patcher = RecordingPatcher()
    pub = InventoryPublisher("node-a", b, patcher, enforcement=mechanisms(True))
    assert await pub.publish_if_changed()
    ((_, first),) = patcher.patches
    assert json.loads(first[contract.ANN_NODE_LANE_ENFORCEMENT]) == {
        "compute": "mps-daemon-per-lane",
        "devices": "device-nodes",
        "isolation": "lane-directories",
        "memory": "mps-daemon-per-lane",
    }
    b.inject_fault("GPU-bbbbbbbb-0000-0000-0000-000000000000")
    assert await pub.publish_if_changed()
    assert list(patcher.patches[-1][1]) == [contract.ANN_NODE_GPUS]  # only what changed is written


def lane_pod(name: str, uid: str, gpu: str, lane: str, mib: int, pct: int) -> dict:
    a = {
        "node": "node-a",
        "gpuUUIDs": [gpu],
        "gpuIndices": [0],
        "laneId": lane,
        "memoryMiB": mib,
        "computePercent": pct,
    }
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "annotations": {contract.ANN_ASSIGNMENT: json.dumps(a)},
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
    }


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[line.index("{") + 1 : line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{{{want}}}")


def test_per_lane_metrics_and_over_limit() -> None:
    b = backend()
    g0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    pods = [
        pod_info_from_manifest(lane_pod("small", UID_A, g0, "lane-1", 2048, 25)),
        pod_info_from_manifest(lane_pod("big", UID_B, g0, "lane-2", 8192, 75)),
    ]
    # two processes of pod A (a dataloader worker has a context too), one of B, the MPS server unattributed
    owners = {101: UID_A, 102: UID_A, 201: UID_B}
    b.add_process(g0, 101, 1800, sm_util=10)
    b.add_process(g0, 102, 400, sm_util=5)
    b.add_process(g0, 201, 6000, sm_util=60)
    b.add_process(g0, 999, 300, mps=False)
    b.set_utilization(g0, 80)
    metrics = AgentMetrics()
    tel = LaneTelemetry("node-a", b, metrics, resolve_pid=owners.get)
    over = tel.update(pods)
    assert [(s.lane, s.memory_used_bytes // MIB) for s in over] == [("lane-1", 2200)]  # 2200 MiB > 2048 MiB

    text = generate_latest(metrics.registry).decode()
    a = {"node": "node-a", "gpu": "0", "lane": "lane-1", "namespace": "ml", "pod": "small"}
    bb = {**a, "lane": "lane-2", "pod": "big"}
    assert sample(text, "tessera_lane_memory_used_bytes", **a) == 2200 * MIB
    assert sample(text, "tessera_lane_memory_limit_bytes", **a) == 2048 * MIB
    assert sample(text, "tessera_lane_compute_limit_ratio", **a) == 0.25
    assert sample(text, "tessera_lane_utilization_ratio", **a) == 0.15
    assert sample(text, "tessera_lane_memory_used_bytes", **bb) == 6000 * MIB
    assert sample(text, "tessera_lane_utilization_ratio", **bb) == 0.6
    assert sample(text, "tessera_lane_over_limit", **a) == 1.0
    assert sample(text, "tessera_lane_over_limit", **bb) == 0.0  # 6000 MiB within 8192 MiB
    gpu0 = {"node": "node-a", "gpu": "0", "uuid": g0}
    assert sample(text, "tessera_gpu_memory_used_bytes", **gpu0) == (1800 + 400 + 6000 + 300) * MIB
    assert sample(text, "tessera_gpu_utilization_ratio", **gpu0) == 0.8
    assert sample(text, "tessera_gpu_healthy", **gpu0) == 1.0

    # the lane drops under its limit and pod B leaves: flag cleared, B's series gone
    b.remove_process(g0, 102)
    assert tel.update(pods[:1]) == []
    text = generate_latest(metrics.registry).decode()
    assert 'pod="big"' not in text
    assert sample(text, "tessera_lane_over_limit", **a) == 0.0  # 1800 MiB, back under 2048 MiB


def test_every_agent_metric_in_the_catalogue_is_exported() -> None:
    text = generate_latest(AgentMetrics().registry).decode()
    for spec in catalog.for_component(catalog.Component.AGENT):
        assert f"# TYPE {spec.name} {spec.type.value}" in text


def test_pod_uid_from_cgroup_both_drivers(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID_A}/0123abcd\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_B.replace('-', '_')}.slice/cri.scope\n"
    )
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cgroup").write_text("0::/system.slice/nvidia-mps.service\n")
    assert pod_uid_from_cgroup(10, tmp_path) == UID_A
    assert pod_uid_from_cgroup(11, tmp_path) == UID_B
    assert pod_uid_from_cgroup(12, tmp_path) is None
    assert pod_uid_from_cgroup(13, tmp_path) is None
