"""Lanes' GPU memory through the cgroup v2 dmem controller, on a fake host cgroup tree (`dmem_tree`): detection,
each GPU's region, the pod cgroup with either kubelet cgroup driver, the limits written in the kernel's format,
the ancestors' protection, removal, a restart, and the refusal to start with `--dmem required`."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from tessera_agent.enforce.cgroups import cgroup2_root, pod_cgroup
from tessera_agent.enforce.dmem import (
    DmemError,
    DmemLimits,
    DmemUnavailable,
    PodMemory,
    detect,
    gpu_regions,
    parse_capacity,
)
from tessera_agent.enforce.dmem_lanes import EVENT_REASON, DmemLanes, PodRef, pods_memory
from tessera_agent.enforce.lane_dirs import LaneLayout
from tessera_agent.enforce.mechanism import EnforcementError, check_dmem, mechanisms
from tessera_agent.gpus.backend import GpuDevice
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.metrics_factory import AgentMetrics

from . import dmem_tree as tree
from .dmem_tree import GIB, REGIONS, lines, uid

MIB = 1024 * 1024


@pytest.fixture
def gpus() -> list[GpuDevice]:
    # NVML spells bus IDs upper case (00000000:41:00.0 here has no letters; make one that has)
    got = FakeGpuBackend.uniform(3).gpus()
    return [replace(g, pci_bus_id=g.pci_bus_id.upper()) for g in got]


def test_capacity_and_regions_match_nvml_bus_ids_as_addresses(gpus: list[GpuDevice]) -> None:
    text = (
        "drm/0000:03:00.0/vram0 8514437120\n"
        "nvidia/00000000:1b:00.0/vidmem 102641958912\n"
        "nvidia/00000000:01:00.0/vidmem 42949672960\n"
    )
    capacity = parse_capacity(text)
    assert capacity["nvidia/00000000:1b:00.0/vidmem"] == 102641958912
    one = replace(gpus[0], pci_bus_id="00000000:1B:00.0")
    # the region spelled as the kernel lists it (a write must name it exactly), whatever NVML's case
    assert gpu_regions([one, gpus[0]], capacity) == {
        one.uuid: "nvidia/00000000:1b:00.0/vidmem",
        gpus[0].uuid: "nvidia/00000000:01:00.0/vidmem",
    }
    with pytest.raises(DmemUnavailable, match=rf"{gpus[1].uuid} \(00000000:02:00.0\)"):
        gpu_regions(gpus[:2], capacity)


def test_the_cgroup2_root_on_v2_hybrid_and_from_mountinfo(tmp_path: Path) -> None:
    v2 = tree.host(tmp_path / "v2")
    hybrid = tree.host(tmp_path / "hy", layout="hybrid")
    assert cgroup2_root(tmp_path / "v2") == v2
    assert cgroup2_root(tmp_path / "hy") == hybrid == tmp_path / "hy" / "unified"
    (tmp_path / "v1").mkdir()
    assert cgroup2_root(tmp_path / "v1") is None
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "25 30 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
        "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 "
        "rw,nsdelegate\n"
        "27 25 0:24 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory\n"
    )
    assert cgroup2_root(None, mountinfo) == Path("/sys/fs/cgroup/unified")
    mountinfo.write_text("26 25 0:23 / /host/sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroup2_root(None, mountinfo) == Path("/host/sys/fs/cgroup")


def test_detect_says_what_is_missing(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    root = tree.host(tmp_path / "ok")
    node = detect(gpus, tmp_path / "ok")
    assert node.root == root and node.regions == {g.uuid: r for g, r in zip(gpus, REGIONS, strict=True)}
    tree.host(tmp_path / "no-controller", controllers="cpu memory pids")
    with pytest.raises(DmemUnavailable, match="no dmem controller"):
        detect(gpus, tmp_path / "no-controller")
    tree.host(tmp_path / "no-driver", regions=["drm/0000:03:00.0/vram0"])
    with pytest.raises(DmemUnavailable, match="no region for GPU"):
        detect(gpus, tmp_path / "no-driver")
    with pytest.raises(DmemUnavailable, match="no cgroup v2 hierarchy"):
        detect(gpus, tmp_path / "missing")


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
@pytest.mark.parametrize("kind", [False, True])
def test_pod_cgroup_with_either_driver(tmp_path: Path, driver: str, qos: str, kind: bool) -> None:
    root = tree.host(tmp_path)
    want = tree.pod(root, uid(1), driver=driver, qos=qos, kind=kind)
    tree.pod(root, uid(2), driver=driver, qos=qos, kind=kind)
    assert pod_cgroup(root, uid(1)) == want
    assert pod_cgroup(root, uid(3)) is None


def test_a_directory_inside_a_pod_named_after_another_pod_is_not_that_pod(tmp_path: Path) -> None:
    root = tree.host(tmp_path)
    mine = tree.pod(root, uid(1))
    tree.cgroup(mine / f"kubepods-burstable-pod{uid(2).replace('-', '_')}.slice")
    (mine / f"pod{uid(2)}").mkdir()
    assert pod_cgroup(root, uid(2)) is None


@pytest.mark.parametrize("layout", ["v2", "hybrid"])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_limits_in_the_kernels_format_and_ancestors_cover_their_pods(
    tmp_path: Path, gpus: list[GpuDevice], layout: str, driver: str
) -> None:
    root = tree.host(tmp_path, layout=layout)
    node = detect(gpus, tmp_path)
    a = tree.pod(root, uid(1), driver=driver, qos="burstable")
    b = tree.pod(root, uid(2), driver=driver, qos="burstable")
    g = tree.pod(root, uid(3), driver=driver, qos="guaranteed")
    limits = DmemLimits(node)
    g0, g1 = gpus[0].uuid, gpus[1].uuid
    assert limits.apply(uid(1), PodMemory({g0: 4096}, {g0: 4096})) == a
    limits.apply(uid(2), PodMemory({g0: 2048, g1: 1024}, {g0: 2048, g1: 1024}))
    limits.apply(uid(3), PodMemory({g1: 10240}, {g1: 10240}))

    assert lines(a / "dmem.max")[REGIONS[0]] == str(4096 * MIB)
    assert lines(a / "dmem.min")[REGIONS[0]] == str(4096 * MIB)
    assert lines(b / "dmem.max") == {
        REGIONS[0]: str(2048 * MIB),
        REGIONS[1]: str(1024 * MIB),
        REGIONS[2]: "max",
    }
    assert lines(g / "dmem.max")[REGIONS[1]] == str(10 * GIB)
    # the container below the pod is left as the kernel made it: the pod's limit bounds it hierarchically
    assert lines(a / "cri-containerd-0123abcd.scope" / "dmem.max")[REGIONS[0]] == "max"
    qos, top = a.parent, a.parent.parent
    assert lines(qos / "dmem.min")[REGIONS[0]] == str(6144 * MIB)
    assert lines(qos / "dmem.min")[REGIONS[1]] == str(1024 * MIB)
    assert lines(top / "dmem.min")[REGIONS[0]] == str(6144 * MIB)
    assert lines(top / "dmem.min")[REGIONS[1]] == str(11264 * MIB)
    # nothing on the root: it has no dmem.max or dmem.min
    assert not (root / "dmem.min").exists() and not (root / "dmem.max").exists()


def test_release_zeroes_the_pod_and_lowers_its_ancestors(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    root = tree.host(tmp_path)
    limits = DmemLimits(detect(gpus, tmp_path), state_path=tmp_path / "state.json")
    g0 = gpus[0].uuid
    a = tree.pod(root, uid(1))
    b = tree.pod(root, uid(2))
    limits.apply(uid(1), PodMemory({g0: 4096}, {g0: 4096}))
    limits.apply(uid(2), PodMemory({g0: 1024}, {g0: 1024}))
    qos = a.parent
    assert lines(qos / "dmem.min")[REGIONS[0]] == str(5120 * MIB)

    limits.release(uid(1))
    assert lines(a / "dmem.min")[REGIONS[0]] == "0"
    assert lines(qos / "dmem.min")[REGIONS[0]] == str(1024 * MIB)
    assert lines(qos.parent / "dmem.min")[REGIONS[0]] == str(1024 * MIB)

    # an agent restarted after pod 2's cgroup went: it knows pod 2 from its state, and its ancestors drop
    shutil.rmtree(b)
    again = DmemLimits(detect(gpus, tmp_path), state_path=tmp_path / "state.json")
    assert set(again.pods) == {uid(2)}
    again.release(uid(2))
    assert lines(qos / "dmem.min")[REGIONS[0]] == "0"
    assert lines(qos.parent / "dmem.min")[REGIONS[0]] == "0"
    assert again.pods == {}


def test_a_gpu_the_pod_no_longer_holds_a_lane_on_is_back_at_the_defaults(
    tmp_path: Path, gpus: list[GpuDevice]
) -> None:
    root = tree.host(tmp_path)
    a = tree.pod(root, uid(1))
    limits = DmemLimits(detect(gpus, tmp_path))
    g0, g1 = gpus[0].uuid, gpus[1].uuid
    limits.apply(uid(1), PodMemory({g0: 100, g1: 200}, {g0: 100, g1: 200}))
    limits.apply(uid(1), PodMemory({g0: 100}, {g0: 100}))
    assert (lines(a / "dmem.max")[REGIONS[1]], lines(a / "dmem.min")[REGIONS[1]]) == ("max", "0")
    assert lines(a.parent / "dmem.min")[REGIONS[1]] == "0"
    assert lines(a / "dmem.max")[REGIONS[0]] == str(100 * MIB)


def test_dmem_is_enabled_down_an_unbroken_chain(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    root = tree.host(tmp_path)
    a = tree.pod(root, uid(1))
    (a.parent.parent / "cgroup.subtree_control").write_text("cpu memory\n")  # kubepods.slice: no dmem
    DmemLimits(detect(gpus, tmp_path)).apply(uid(1), PodMemory({gpus[0].uuid: 512}))
    # what `echo +dmem > cgroup.subtree_control` writes (cgroup-v2.rst, "Enabling and Disabling")
    assert (a.parent.parent / "cgroup.subtree_control").read_text() == "+dmem\n"
    assert (a.parent / "cgroup.subtree_control").read_text() == "cpu memory dmem\n"


def test_no_pod_cgroup_or_no_dmem_files_is_an_error(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    root = tree.host(tmp_path)
    limits = DmemLimits(detect(gpus, tmp_path))
    with pytest.raises(DmemError, match="has no pod cgroup"):
        limits.apply(uid(9), PodMemory({gpus[0].uuid: 512}))
    a = tree.pod(root, uid(1))
    (a / "dmem.max").unlink()
    with pytest.raises(DmemError, match=r"no dmem\.max"):
        limits.apply(uid(1), PodMemory({gpus[0].uuid: 512}))


def test_without_the_guarantee_only_the_hard_limit_is_written(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    root = tree.host(tmp_path)
    a = tree.pod(root, uid(1))
    DmemLimits(detect(gpus, tmp_path), guarantee=False).apply(uid(1), PodMemory({gpus[0].uuid: 512}, {}))
    assert lines(a / "dmem.max")[REGIONS[0]] == str(512 * MIB)
    assert lines(a / "dmem.min")[REGIONS[0]] == "0"
    assert lines(a.parent / "dmem.min")[REGIONS[0]] == "0"


def test_pods_memory_sums_a_pods_lanes_and_guarantees_no_shared_lane() -> None:
    got = pods_memory([({"g0": 100}, ["p1"]), ({"g0": 50, "g1": 10}, ["p1"]), ({"g1": 30}, ["p1", "p2"])])
    assert got["p1"] == PodMemory({"g0": 150, "g1": 40}, {"g0": 150, "g1": 10})
    assert got["p2"] == PodMemory({"g1": 30}, {})


def test_required_refuses_to_start_naming_the_fix(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    tree.host(tmp_path, controllers="cpu memory")
    with pytest.raises(EnforcementError, match=r"--dmem required: .*no dmem controller.*Linux 6\.14"):
        check_dmem("required", gpus, tmp_path)
    assert check_dmem("auto", gpus, tmp_path) is None
    assert check_dmem("off", gpus, tmp_path / "never-read") is None
    tree.host(tmp_path / "ok")
    node = check_dmem("required", gpus, tmp_path / "ok")
    assert node is not None and node.root == tmp_path / "ok"


def test_the_mechanism_report_names_dmem_for_memory(tmp_path: Path) -> None:
    assert mechanisms(True, dmem=True)["memory"] == "dmem+mps-daemon-per-lane"
    assert mechanisms(True, LaneLayout(tmp_path, "v3"), dmem=True)["memory"] == "dmem+mps-namespace"
    assert mechanisms(True, dmem=True)["compute"] == "mps-daemon-per-lane"
    assert mechanisms(False, dmem=True)["memory"] == "dmem"
    assert mechanisms(True)["memory"] == "mps-daemon-per-lane"


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, bool]] = []

    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None:
        self.sent.append((pod, reason, message, warning))


async def test_a_limit_not_written_is_reported_once_and_refused_when_required(
    tmp_path: Path, gpus: list[GpuDevice]
) -> None:
    tree.host(tmp_path)
    events, metrics = Events(), AgentMetrics()
    lanes = DmemLanes(DmemLimits(detect(gpus, tmp_path)), "n1", metrics=metrics, events=events)
    ref = PodRef(uid(1), "ml", "train")
    memory = PodMemory({gpus[0].uuid: 512})
    assert not await lanes.apply(ref, memory, when="PreStartContainer")
    assert not await lanes.apply(ref, memory, when="PreStartContainer")
    ((pod, reason, message, warning),) = events.sent
    assert (pod, reason, warning) == ("ml/train", EVENT_REASON, True)
    assert "PreStartContainer" in message and "no pod cgroup" in message
    failures = metrics.registry.get_sample_value("tessera_agent_dmem_failures_total", {"node": "n1"})
    assert failures == 2
    lanes.required = True
    with pytest.raises(DmemError):
        await lanes.apply(ref, memory, when="PreStartContainer")


async def test_sync_reapplies_and_releases(tmp_path: Path, gpus: list[GpuDevice]) -> None:
    root = tree.host(tmp_path)
    metrics = AgentMetrics()
    lanes = DmemLanes(DmemLimits(detect(gpus, tmp_path)), "n1", metrics=metrics, gpu_index={gpus[0].uuid: 0})
    a = tree.pod(root, uid(1))
    g0 = gpus[0].uuid
    refs = {uid(1): PodRef(uid(1), "ml", "a"), uid(2): PodRef(uid(2), "ml", "b")}
    # pod 2 holds a lane but has no cgroup yet: left to a later round, no failure
    await lanes.sync({uid(1): PodMemory({g0: 256}, {g0: 256}), uid(2): PodMemory({g0: 1})}, refs)
    assert lines(a / "dmem.max")[REGIONS[0]] == str(256 * MIB)
    labels = {"node": "n1", "namespace": "ml", "pod": "a", "gpu": "0", "limit": "max"}
    assert metrics.registry.get_sample_value("tessera_agent_lane_dmem_bytes", labels) == 256 * MIB
    assert metrics.registry.get_sample_value("tessera_agent_dmem_failures_total", {"node": "n1"}) in (None, 0)
    (a / "dmem.max").write_text(f"{REGIONS[0]} max\n")  # undone behind the agent's back: written again
    await lanes.sync({uid(1): PodMemory({g0: 256}, {g0: 256})}, refs)
    assert lines(a / "dmem.max")[REGIONS[0]] == str(256 * MIB)
    await lanes.sync({}, refs)
    assert lines(a / "dmem.min")[REGIONS[0]] == "0"
    assert lines(a.parent / "dmem.min")[REGIONS[0]] == "0"
    assert metrics.registry.get_sample_value("tessera_agent_lane_dmem_bytes", labels) is None
