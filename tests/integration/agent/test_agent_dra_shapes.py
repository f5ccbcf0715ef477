"""What the DRA driver prepares for each shape an allocation can take (issue 40), over real gRPC with the test as
the kubelet, each claim's MPS daemon the fake control binary (which records what it is told) and the lane book
on: one request; two requests of one claim on one GPU (two shares, charged separately by the allocator: the
lane is their sum); two requests on two GPUs; one claim shared by two pods; and a result with admin access,
prepared as an observer (the GPU visible, no lane, no limits, nothing charged)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.enforce.lane_daemons import LaneDaemons
from tessera_agent.enforce.lane_dirs import LaneDirs
from tessera_agent.gpus.backend import usable_memory_mib
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_lanes import ClaimError, cdi_spec_path
from tessera_agent.kubelet.dra_plugin import Checkpoint, DraDriver, DraServicer
from tessera_agent.lanes.book import LaneBook
from tessera_agent.proto import dra_v1_pb2, dra_v1_pb2_grpc

from .test_agent_dra import DEADLINE_S, NODE, FakeDraApi, claim, result
from .waiting import until

FAKE_MPS = str(Path(__file__).parent / "fake-bin" / "nvidia-cuda-mps-control")
USABLE_MIB = 40960 - 512  # the fake A100's memory less the driver reserve
# tags.cncf.io/container-device-interface (pkg/parser): what a CDI device name may be
CDI_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
SHARE_A = "aaaaaaaa-0000-0000-0000-00000000000a"
SHARE_B = "bbbbbbbb-0000-0000-0000-00000000000b"


class Driver:
    def __init__(self, driver: DraDriver, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.driver, self.stop, self.task = driver, stop, task

    @property
    def servicer(self) -> DraServicer:
        return self.driver.servicer

    @property
    def book(self) -> LaneBook:
        assert self.servicer.lanes is not None
        return self.servicer.lanes

    async def prepare(self, name: str, uid: str) -> dra_v1_pb2.NodePrepareResourcesResponse:
        req = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=uid)]
        )
        async with grpc.aio.insecure_channel(f"unix://{self.servicer.cfg.dra_socket}") as channel:
            return await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(req, timeout=DEADLINE_S)

    async def unprepare(self, name: str, uid: str) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        req = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="ml", name=name, uid=uid)]
        )
        async with grpc.aio.insecure_channel(f"unix://{self.servicer.cfg.dra_socket}") as channel:
            return await dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                req, timeout=DEADLINE_S
            )

    def spec(self, uid: str) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(cdi_spec_path(self.servicer.cfg.cdi_dir, uid).read_text())
        names = [d["name"] for d in spec["devices"]]
        # The runtime drops a spec that names a device twice, and with it every device of the claim.
        assert len(set(names)) == len(names), f"CDI spec names a device twice: {names}"
        assert all(CDI_NAME.fullmatch(n) for n in names), names
        return spec

    def env(self, uid: str) -> dict[str, str]:
        envs = [dict(e.split("=", 1) for e in d["containerEdits"]["env"]) for d in self.spec(uid)["devices"]]
        assert all(e == envs[0] for e in envs)  # every CDI device of the claim carries the claim's lane
        return envs[0]

    def told(self, uid: str) -> list[str]:
        """What the claim's MPS daemon was told, after its start."""
        log = self.servicer.daemons.dirs.paths(uid).pipe / "commands.log"
        return [line.split(" ", 1)[1] for line in log.read_text().splitlines()][1:]


@pytest.fixture
def backend() -> FakeGpuBackend:
    return FakeGpuBackend.uniform(2)


@pytest.fixture
def api() -> FakeDraApi:
    return FakeDraApi()


@pytest.fixture
async def driver(plugin_dir: Path, backend: FakeGpuBackend, api: FakeDraApi) -> AsyncIterator[Driver]:
    cfg = AgentConfig(
        node_name=NODE,
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        progress_socket=Path("/run/tessera/progress/progress.sock"),
        lanes_api="dra",
        hp_be_lanes=True,
        be_percent=100,  # best-effort lanes keep their allocated share: what is checked here is that share
    )
    book = LaneBook({g.uuid: usable_memory_mib(g) for g in backend.gpus()}, default_be_percent=cfg.be_percent)
    daemons = LaneDaemons(LaneDirs(cfg.mps_root), binary=FAKE_MPS)
    d = DraDriver(cfg, backend, api, daemons, book)
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    await until(lambda: cfg.dra_registration_socket.exists() and bool(api.slices), "the driver to serve")
    yield Driver(d, stop, task)
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)
    await daemons.close()


def answered(got: dra_v1_pb2.NodePrepareResourcesResponse, uid: str) -> list[tuple[list[str], str, str, str]]:
    answer = got.claims[uid]
    assert answer.error == "", answer.error
    return [
        (list(d.request_names), d.device_name, d.share_id, ",".join(d.cdi_device_ids)) for d in answer.devices
    ]


def lane_id(name: str) -> str:
    return f"{contract.DRA_CDI_KIND}={name}"


async def test_one_request_gets_its_share(driver: Driver, api: FakeDraApi, backend: FakeGpuBackend) -> None:
    u0 = backend.gpus()[0].uuid
    api.claims[("ml", "one")] = claim("one", "uid-1", [result("gpu-0", "10Gi", "30", share=SHARE_A)])
    got = await driver.prepare("one", "uid-1")
    assert answered(got, "uid-1") == [(["gpu"], "gpu-0", SHARE_A, lane_id("uid-1-gpu-0"))]
    env = driver.env("uid-1")
    assert (env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (
        "0=10240M",
        "30",
    )
    assert driver.told("uid-1")[:2] == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 10240M",
    ]
    assert [(ln.gpu, ln.memory_mib) for ln in driver.book.on_gpu(u0)] == [(u0, 10240)]


async def test_two_requests_on_one_gpu_get_the_sum_the_allocator_charged(
    driver: Driver, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    """Two shares of gpu-0 in one claim, 10 GiB / 30 % each: the allocator charged 20 GiB / 60 %, and that is
    the container's lane; each share stays its own device in the kubelet's answer and its own CDI device."""
    u0 = backend.gpus()[0].uuid
    api.claims[("ml", "pair")] = claim(
        "pair",
        "uid-2",
        [
            result("gpu-0", "10Gi", "30", request="a", share=SHARE_A),
            result("gpu-0", "10Gi", "30", request="b", share=SHARE_B),
        ],
    )
    got = await driver.prepare("pair", "uid-2")
    assert answered(got, "uid-2") == [
        (["a"], "gpu-0", SHARE_A, lane_id(f"uid-2-gpu-0-{SHARE_A}")),
        (["b"], "gpu-0", SHARE_B, lane_id(f"uid-2-gpu-0-{SHARE_B}")),
    ]
    spec = driver.spec("uid-2")
    assert [d["name"] for d in spec["devices"]] == [f"uid-2-gpu-0-{SHARE_A}", f"uid-2-gpu-0-{SHARE_B}"]
    env = driver.env("uid-2")
    assert env["CUDA_VISIBLE_DEVICES"] == u0  # one GPU, seen once
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    # held server-side by the claim's own daemon, and charged in the lane book, as the sum
    assert driver.told("uid-2")[:2] == [
        "set_default_active_thread_percentage 60",
        "set_default_device_pinned_mem_limit 0 20480M",
    ]
    assert [(ln.uid, ln.memory_mib) for ln in driver.book.on_gpu(u0)] == [("uid-2", 20480)]
    saved = Checkpoint.load(driver.servicer.checkpoint_path).claims["uid-2"]
    assert saved.limits == {u0: (20480, 60)}
    # the book counts 20 GiB: a claim of what is left fits, one MiB more does not
    left = USABLE_MIB - 20480
    api.claims[("ml", "rest")] = claim("rest", "uid-r", [result("gpu-0", f"{left + 1}Mi", "40")], pod="rest")
    refused = await driver.prepare("rest", "uid-r")
    assert f"would bring its lanes to {USABLE_MIB + 1} MiB" in refused.claims["uid-r"].error
    api.claims[("ml", "rest")] = claim("rest", "uid-r", [result("gpu-0", f"{left}Mi", "40")], pod="rest")
    assert answered(await driver.prepare("rest", "uid-r"), "uid-r")


async def test_shares_of_one_gpu_add_up_to_at_most_the_whole_gpu(driver: Driver, api: FakeDraApi) -> None:
    # Compute past 100 %: more than the device has, which only another allocator could write; the lane is
    # capped at the whole GPU. Memory past what the GPU has cannot be honoured: refused with the reason.
    api.claims[("ml", "over")] = claim(
        "over",
        "uid-o",
        [result("gpu-1", "4Gi", "70", "a", SHARE_A), result("gpu-1", "4Gi", "60", "b", SHARE_B)],
    )
    await driver.prepare("over", "uid-o")
    assert driver.env("uid-o")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    api.claims[("ml", "big")] = claim(
        "big",
        "uid-b",
        [result("gpu-0", "30Gi", "10", "a", SHARE_A), result("gpu-0", "20Gi", "10", "b", SHARE_B)],
    )
    got = await driver.prepare("big", "uid-b")
    assert got.claims["uid-b"].error == (
        f"claim uid-b: its shares of gpu-0 add up to 51200 MiB, more than the {USABLE_MIB} MiB it has usable"
    )
    assert not cdi_spec_path(driver.servicer.cfg.cdi_dir, "uid-b").exists()
    assert not driver.servicer.daemons.dirs.paths("uid-b").root.exists()


async def test_two_requests_on_two_gpus_and_two_shares_beside_them(
    driver: Driver, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    u0, u1 = (g.uuid for g in backend.gpus())
    api.claims[("ml", "wide")] = claim(
        "wide",
        "uid-w",
        [result("gpu-0", "8Gi", "50", "a", SHARE_A), result("gpu-1", "4Gi", "40", "b", SHARE_B)],
    )
    got = await driver.prepare("wide", "uid-w")
    assert [(d[1], d[3]) for d in answered(got, "uid-w")] == [
        ("gpu-0", lane_id("uid-w-gpu-0")),
        ("gpu-1", lane_id("uid-w-gpu-1")),
    ]
    env = driver.env("uid-w")
    assert env["CUDA_VISIBLE_DEVICES"] == f"{u0},{u1}"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"  # one percentage per process: the smaller one
    assert {(ln.gpu, ln.memory_mib) for ln in driver.book.lanes.values()} == {(u0, 8192), (u1, 4096)}

    # Two shares of gpu-0 and one of gpu-1: gpu-0's lane is the sum, the percentage the smallest GPU's.
    api.claims[("ml", "three")] = claim(
        "three",
        "uid-3",
        [
            result("gpu-0", "4Gi", "20", "a", SHARE_A),
            result("gpu-1", "2Gi", "40", "b", "cccccccc-0000-0000-0000-00000000000c"),
            result("gpu-0", "4Gi", "30", "c", SHARE_B),
        ],
    )
    got = await driver.prepare("three", "uid-3")
    assert [d[1] for d in answered(got, "uid-3")] == ["gpu-0", "gpu-1", "gpu-0"]
    env = driver.env("uid-3")
    assert env["CUDA_VISIBLE_DEVICES"] == f"{u0},{u1}"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=2048M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"  # gpu-0 50 %, gpu-1 40 %


async def test_one_claim_shared_by_two_pods_is_one_lane(
    driver: Driver, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    """The allocator charged the claim once; both pods hold that one lane (its daemon, its limits), neither
    gets a progress endpoint of the other's name, and both may report against it."""
    u0 = backend.gpus()[0].uuid
    c = claim("shared", "uid-s", [result("gpu-0", "10Gi", "30", share=SHARE_A)], pod="train-0")
    c["status"]["reservedFor"].append({"resource": "pods", "name": "train-1", "uid": "uid-train-1"})
    api.claims[("ml", "shared")] = c
    answered(await driver.prepare("shared", "uid-s"), "uid-s")
    env = driver.env("uid-s")
    assert (env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (
        "0=10240M",
        "30",
    )
    assert env["TESSERA_LANE_ID"] == "uid-s" and "TESSERA_PROGRESS_ENDPOINT" not in env
    assert [(ln.uid, ln.memory_mib) for ln in driver.book.on_gpu(u0)] == [("uid-s", 10240)]
    for pod in ("uid-train-0", "uid-train-1"):
        assert await driver.servicer.holds_lane("ml", pod)
    assert not await driver.servicer.holds_lane("ml", "uid-other")


def observer_result(device: str) -> dict[str, Any]:
    # As kube-scheduler writes it: a share ID and the request's consumed capacity (here the defaults, the
    # whole GPU), which the allocator does not count against the device for an admin-access result.
    r = result(device, f"{USABLE_MIB}Mi", "100", request="monitor", share=SHARE_A)
    r["adminAccess"] = True
    return r


async def test_admin_access_is_prepared_as_an_observer(
    driver: Driver, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    u1 = backend.gpus()[1].uuid
    api.claims[("ml", "dcgm")] = claim("dcgm", "uid-m", [observer_result("gpu-1")], pod="dcgm")
    got = await driver.prepare("dcgm", "uid-m")
    assert answered(got, "uid-m") == [(["monitor"], "gpu-1", SHARE_A, lane_id("uid-m-gpu-1"))]
    (dev,) = driver.spec("uid-m")["devices"]
    edits = dev["containerEdits"]
    # the GPU visible, and nothing of a lane: no MPS pipe or limits, no lane ID, no mounts
    assert driver.env("uid-m") == {"CUDA_VISIBLE_DEVICES": u1, "NVIDIA_VISIBLE_DEVICES": u1}
    assert "mounts" not in edits
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    # nothing charged: no lane in the book, no daemon, no lane directories; the checkpoint says observer
    assert driver.book.lanes == {}
    assert driver.servicer.daemons.running("uid-m") is None
    assert not driver.servicer.daemons.dirs.paths("uid-m").root.exists()
    saved = Checkpoint.load(driver.servicer.checkpoint_path).claims["uid-m"]
    assert (saved.state, saved.observer, saved.limits) == ("prepared", True, {})
    # an observer holds no lane: its pod reports no progress and shows in no lane's telemetry
    assert not await driver.servicer.holds_lane("ml", "uid-dcgm")
    assert driver.servicer.held_lanes([]) == []
    # the whole GPU is still there for lanes, the high-priority one included
    api.claims[("ml", "all")] = claim("all", "uid-a", [result("gpu-1", f"{USABLE_MIB}Mi", "100")], pod="all")
    api.claims["ml", "all"]["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": contract.DRA_DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tessera.io/v1alpha1",
                    "kind": "LaneConfig",
                    "class": "latency-critical",
                },
            },
        }
    ]
    answered(await driver.prepare("all", "uid-a"), "uid-a")
    assert [(ln.uid, ln.klass, ln.memory_mib) for ln in driver.book.on_gpu(u1)] == [
        ("uid-a", "HP", USABLE_MIB)
    ]

    # a restarted driver starts no daemon for the observer
    await driver.servicer.daemons.close()
    again = DraServicer(
        driver.servicer.cfg,
        backend,
        api,
        LaneDaemons(LaneDirs(driver.servicer.cfg.mps_root), binary=FAKE_MPS),
        LaneBook({g.uuid: usable_memory_mib(g) for g in backend.gpus()}, default_be_percent=100),
    )
    try:
        await again.restore_lanes()
        assert again.daemons.running("uid-m") is None and again.daemons.running("uid-a") is not None
        assert again.lanes is not None and {ln.uid for ln in again.lanes.lanes.values()} == {"uid-a"}
    finally:
        await again.daemons.close()

    gone = await driver.unprepare("dcgm", "uid-m")
    assert gone.claims["uid-m"].error == ""
    assert not cdi_spec_path(driver.servicer.cfg.cdi_dir, "uid-m").exists()


async def test_a_claim_that_mixes_admin_access_with_a_lane_is_refused(
    driver: Driver, api: FakeDraApi
) -> None:
    api.claims[("ml", "mixed")] = claim(
        "mixed", "uid-x", [observer_result("gpu-1"), result("gpu-0", "1Gi", "10", share=SHARE_B)]
    )
    got = await driver.prepare("mixed", "uid-x")
    assert got.claims["uid-x"].error == (
        f"claim uid-x mixes admin-access results with ordinary ones on node {NODE}; "
        "an observer and a lane need two claims"
    )
    assert driver.book.lanes == {}
    with pytest.raises(ClaimError, match="mixes admin-access"):
        await driver.servicer.prepare("ml", "mixed", "uid-x")
