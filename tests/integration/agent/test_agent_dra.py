"""The DRA driver over real gRPC on temporary unix sockets, with the kubelet's side played by the test: plugin
registration, NodePrepareResources / NodeUnprepareResources and the CDI specs they leave, the ResourceSlice,
and an agent stopped in the middle of a prepare (issue 30)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet import dra_plugin
from tessera_agent.kubelet.dra_plugin import DRA_SERVICE, HEALTH_SERVICE, Checkpoint, DraApi, DraDriver
from tessera_agent.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

from .waiting import until

NODE = "node-a"
DEADLINE_S = 30.0


class FakeDraApi(DraApi):
    """Claims and ResourceSlices in memory, as the API server would hold them."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.claim_reads = 0
        self._rv = 0

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.claim_reads += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise LookupError(f"resourceclaims {namespace}/{name} not found") from None

    async def node_uid(self, node: str) -> str | None:
        return "node-uid-1"

    async def get_slice(self, name: str) -> dict[str, Any] | None:
        return self.slices.get(name)

    async def put_slice(self, body: dict[str, Any], *, create: bool) -> dict[str, Any]:
        name = body["metadata"]["name"]
        assert (name in self.slices) != create
        if not create:
            assert body["metadata"]["resourceVersion"] == self.slices[name]["metadata"]["resourceVersion"]
        self._rv += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self._rv)
        self.slices[name] = stored
        return stored


def claim(
    name: str, uid: str, results: list[dict[str, Any]], pod: str | None = "train-0", ns: str = "ml"
) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return {"metadata": {"name": name, "namespace": ns, "uid": uid}, "status": status}


def result(device: str, memory: str, compute: str, request: str = "gpu", share: str | None = None) -> dict:
    r: dict[str, Any] = {
        "request": request,
        "driver": contract.DRA_DRIVER,
        "pool": NODE,
        "device": device,
        "consumedCapacity": {"memory": memory, "computeShare": compute, "clients": "1"},
    }
    if share:
        r["shareID"] = share
    return r


@pytest.fixture
def cfg(plugin_dir: Path) -> AgentConfig:
    return AgentConfig(
        node_name=NODE,
        slots_per_gpu=4,
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        progress_socket=Path("/run/tessera/progress/progress.sock"),
    )


@pytest.fixture
def backend() -> FakeGpuBackend:
    return FakeGpuBackend.uniform(2)


@pytest.fixture
def api() -> FakeDraApi:
    return FakeDraApi()


class Running:
    def __init__(self, driver: DraDriver, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.driver, self.stop, self.task = driver, stop, task

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, DEADLINE_S)


async def start(cfg: AgentConfig, backend: FakeGpuBackend, api: FakeDraApi) -> Running:
    driver = DraDriver(cfg, backend, api)
    stop = asyncio.Event()
    task = asyncio.create_task(driver.run(stop))
    await until(lambda: cfg.dra_registration_socket.exists() and bool(api.slices), "the driver to serve")
    return Running(driver, stop, task)


@pytest.fixture
async def running(cfg: AgentConfig, backend: FakeGpuBackend, api: FakeDraApi) -> AsyncIterator[Running]:
    r = await start(cfg, backend, api)
    yield r
    if not r.task.done():
        await r.halt()


def dra_stub(cfg: AgentConfig) -> tuple[grpc.aio.Channel, dra_v1_pb2_grpc.DRAPluginStub]:
    channel = grpc.aio.insecure_channel(f"unix://{cfg.dra_socket}")
    return channel, dra_v1_pb2_grpc.DRAPluginStub(channel)


def claims(*triples: tuple[str, str, str]) -> list[dra_v1_pb2.Claim]:
    return [dra_v1_pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in triples]


def cdi_env(path: Path) -> dict[str, str]:
    spec = json.loads(path.read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    return dict(e.split("=", 1) for e in env)


async def test_registration_answers_what_the_kubelet_checks(running: Running, cfg: AgentConfig) -> None:
    async with grpc.aio.insecure_channel(f"unix://{cfg.dra_registration_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=DEADLINE_S)
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            contract.DRA_DRIVER,
            str(cfg.dra_socket),
        )
        # the kubelet (pkg/kubelet/cm/dra/plugin) picks the first of these it knows
        assert list(info.supported_versions) == [DRA_SERVICE, HEALTH_SERVICE]
        assert [DRA_SERVICE, HEALTH_SERVICE] == [
            "v1.DRAPlugin",
            "v1.DRAResourceHealth",
        ]  # the kubelet's names
        await stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=DEADLINE_S
        )
    assert running.driver.registration.registered.is_set()


async def test_ready_once_the_kubelet_registers_the_driver_and_the_slice_is_published(
    running: Running, cfg: AgentConfig
) -> None:
    """What the agent's /readyz answers (health.py): the slice is published (start waits for it), the kubelet
    has not yet said it registered the driver; a refusal is named; ready after the kubelet's yes."""
    driver = running.driver
    assert "waiting for the kubelet to register" in (driver.readiness() or "")
    async with grpc.aio.insecure_channel(f"unix://{cfg.dra_registration_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        refused = pluginregistration_v1_pb2.RegistrationStatus(
            plugin_registered=False, error="no such version"
        )
        await stub.NotifyRegistrationStatus(refused, timeout=DEADLINE_S)
        assert "last refusal: no such version" in (driver.readiness() or "")
        await stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=DEADLINE_S
        )
        assert driver.readiness() is None
        # a kubelet that refuses the driver later (after its restart) makes the node unready again
        await stub.NotifyRegistrationStatus(refused, timeout=DEADLINE_S)
        assert "last refusal: no such version" in (driver.readiness() or "")
        await stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=DEADLINE_S
        )
    assert driver.readiness() is None
    await running.halt()
    assert "not serving" in (driver.readiness() or "")


async def test_slice_has_one_shareable_device_per_gpu(
    running: Running, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    (s,) = api.slices.values()
    assert s["metadata"]["name"] == f"{NODE}-{contract.DRA_DRIVER}"
    assert s["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    spec = s["spec"]
    assert (spec["driver"], spec["nodeName"]) == (contract.DRA_DRIVER, NODE)
    assert spec["pool"] == {"name": NODE, "generation": 0, "resourceSliceCount": 1}
    gpus = backend.gpus()
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    dev = spec["devices"][1]
    assert dev["allowMultipleAllocations"] is True
    assert dev["attributes"] == {
        "uuid": {"string": gpus[1].uuid},
        "index": {"int": 1},
        "model": {"string": "NVIDIA A100-SXM4-40GB"},
        "computeCapability": {"string": "8.0"},
        "mig": {"bool": False},
        "health": {"string": "Healthy"},
        "pcieRoot": {"string": "pci0000:00"},  # the fake's two GPUs share a root (gpus_per_root=2)
        "numaNode": {"int": 0},
    }
    usable = f"{40960 - 512}Mi"  # total less the driver reserve
    assert dev["capacity"]["memory"] == {
        "value": usable,
        "requestPolicy": {"default": usable, "validRange": {"min": "1Mi", "max": usable, "step": "1Mi"}},
    }
    assert dev["capacity"]["computeShare"]["requestPolicy"]["validRange"] == {
        "min": "1",
        "max": "100",
        "step": "1",
    }
    assert dev["capacity"]["clients"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }


async def test_health_change_publishes_a_new_generation(
    running: Running, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    uuid = backend.gpus()[0].uuid
    backend.inject_fault(uuid)
    name = f"{NODE}-{contract.DRA_DRIVER}"
    await until(lambda: api.slices[name]["spec"]["pool"]["generation"] == 1, "a new slice generation")
    dev = api.slices[name]["spec"]["devices"][0]
    assert dev["attributes"]["health"] == {"string": "Unhealthy"}
    assert dev["taints"] == [{"key": contract.DRA_TAINT_UNHEALTHY, "effect": "NoSchedule"}]
    assert "taints" not in api.slices[name]["spec"]["devices"][1]

    backend.recover(uuid)
    await until(lambda: api.slices[name]["spec"]["pool"]["generation"] == 2, "the GPU healthy again")
    dev = api.slices[name]["spec"]["devices"][0]
    assert dev["attributes"]["health"] == {"string": "Healthy"}
    assert "taints" not in dev


async def test_the_health_stream_tells_the_kubelet_each_gpus_health_and_every_change(
    running: Running, cfg: AgentConfig, backend: FakeGpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KEP-4680: the kubelet's NodeWatchResources on the DRA socket, as the kubelet reads it. The periodic
    resend is pushed past the deadline: only the change itself can bring the second reply."""
    monkeypatch.setattr(dra_plugin, "HEALTH_RESEND_S", 3600.0)

    def health(reply: dra_health_v1_pb2.NodeWatchResourcesResponse) -> dict[str, tuple[int, str]]:
        assert {d.device.pool_name for d in reply.devices} == {NODE}
        assert all(d.health_check_timeout_seconds == 60 and d.last_updated_time > 0 for d in reply.devices)
        return {d.device.device_name: (d.health, d.message) for d in reply.devices}

    ok = dra_health_v1_pb2.HEALTHY
    async with grpc.aio.insecure_channel(f"unix://{cfg.dra_socket}") as channel:
        stream = dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            dra_health_v1_pb2.NodeWatchResourcesRequest()
        )
        first = await asyncio.wait_for(stream.read(), DEADLINE_S)
        assert health(first) == {"gpu-0": (ok, ""), "gpu-1": (ok, "")}
        backend.inject_fault(backend.gpus()[1].uuid)
        second = await asyncio.wait_for(stream.read(), DEADLINE_S)
        assert health(second) == {
            "gpu-0": (ok, ""),
            "gpu-1": (dra_health_v1_pb2.UNHEALTHY, "XID 79: GPU has fallen off the bus"),
        }
        stream.cancel()


async def test_a_restarted_agent_keeps_the_taints_it_set(
    cfg: AgentConfig, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    """NVML reports an XID once: the agent after a restart (all GPUs healthy to NVML) takes the taint back
    from its slice, with the time the API server gave it, and changes nothing."""
    cfg = cfg.model_copy(update={"dra_unhealthy_effect": "NoExecute"})
    first = await start(cfg, backend, api)
    backend.inject_fault(backend.gpus()[1].uuid)
    name = f"{NODE}-{contract.DRA_DRIVER}"
    await until(lambda: api.slices[name]["spec"]["pool"]["generation"] == 1, "the taint published")
    await first.halt()
    added = datetime.now(UTC).replace(microsecond=0).isoformat()  # as the API server sets it: after the boot
    api.slices[name]["spec"]["devices"][1]["taints"][0]["timeAdded"] = added
    published = json.loads(json.dumps(api.slices[name]))

    again = await start(cfg, FakeGpuBackend.uniform(2), api)
    uuid = backend.gpus()[1].uuid
    try:
        await until(lambda: not again.driver.slices.health[uuid], "the taint taken back")
    finally:
        await again.halt()  # after the publish under way
    assert api.slices[name] == published


async def test_prepare_writes_the_lane_into_a_cdi_spec_and_unprepare_removes_it(
    running: Running, cfg: AgentConfig, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    uuid1 = backend.gpus()[1].uuid
    api.claims[("ml", "train-0-gpu")] = claim(
        "train-0-gpu", "uid-c1", [result("gpu-1", "10Gi", "30", share="aaaaaaaa-0000-0000-0000-000000000001")]
    )
    channel, stub = dra_stub(cfg)
    async with channel:
        got = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(("ml", "train-0-gpu", "uid-c1"))),
            timeout=DEADLINE_S,
        )
        answer = got.claims["uid-c1"]
        assert answer.error == ""
        (dev,) = answer.devices
        assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["gpu"], NODE, "gpu-1")
        assert list(dev.cdi_device_ids) == [f"{contract.DRA_DRIVER}/lane=uid-c1-gpu-1"]
        assert dev.share_id == "aaaaaaaa-0000-0000-0000-000000000001"

        spec_path = cfg.cdi_dir / f"{contract.DRA_DRIVER}-uid-c1.json"
        spec = json.loads(spec_path.read_text())
        assert (spec["kind"], spec["devices"][0]["name"]) == ("gpu.tessera.io/lane", "uid-c1-gpu-1")
        env = cdi_env(spec_path)
        assert env == {
            "CUDA_VISIBLE_DEVICES": uuid1,
            "NVIDIA_VISIBLE_DEVICES": uuid1,
            "CUDA_MPS_PIPE_DIRECTORY": "/mps/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
            "TESSERA_LANE_ID": "uid-c1",
            "TESSERA_PROGRESS_ENDPOINT": "http+unix://%2Frun%2Ftessera%2Fprogress%2Fprogress.sock"
            "/v1/namespaces/ml/pods/train-0/progress",
        }
        mounts = {m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]}
        assert mounts == {  # the claim's own pipe directory and /dev/shm
            "/mps/pipe": str(cfg.mps_root / "lanes" / "uid-c1" / "pipe"),
            "/dev/shm": str(cfg.mps_root / "lanes" / "uid-c1" / "shm"),
            "/run/tessera/progress": "/run/tessera/progress",
        }
        assert all(Path(m).is_dir() for m in list(mounts.values())[:2])  # the runtime would not make them
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert [(n["path"], n["hostPath"]) for n in nodes] == [
            ("/dev/nvidia1", "/dev/nvidia1"),
            ("/dev/nvidiactl", "/dev/nvidiactl"),
            ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
            ("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools"),
        ]

        # The kubelet may ask again (after its own restart): answered from the checkpoint, the API not read.
        reads = api.claim_reads
        again = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(("ml", "train-0-gpu", "uid-c1"))),
            timeout=DEADLINE_S,
        )
        assert again.claims["uid-c1"] == answer and api.claim_reads == reads

        gone = await stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims(("ml", "train-0-gpu", "uid-c1"))),
            timeout=DEADLINE_S,
        )
        assert gone.claims["uid-c1"].error == ""
        assert not spec_path.exists()
        assert not (cfg.mps_root / "lanes" / "uid-c1").exists()  # the claim's directories go with it
        assert Checkpoint.load(cfg.dra_plugin_dir / "checkpoint.json").claims == {}
        # unprepare is idempotent too
        again_gone = await stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims(("ml", "train-0-gpu", "uid-c1"))),
            timeout=DEADLINE_S,
        )
        assert again_gone.claims["uid-c1"].error == ""


async def test_a_claim_over_two_gpus_sees_both_in_each_device(
    running: Running, cfg: AgentConfig, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    u0, u1 = (g.uuid for g in backend.gpus())
    api.claims[("ml", "wide")] = claim(
        "wide", "uid-w", [result("gpu-0", "8Gi", "50", "a"), result("gpu-1", "4Gi", "40", "b")], pod=None
    )
    channel, stub = dra_stub(cfg)
    async with channel:
        got = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(("ml", "wide", "uid-w"))), timeout=DEADLINE_S
        )
    devices = got.claims["uid-w"].devices
    assert [(list(d.request_names), d.device_name) for d in devices] == [(["a"], "gpu-0"), (["b"], "gpu-1")]
    assert not any(d.HasField("share_id") for d in devices)
    spec = json.loads((cfg.cdi_dir / f"{contract.DRA_DRIVER}-uid-w.json").read_text())
    envs = [dict(e.split("=", 1) for e in d["containerEdits"]["env"]) for d in spec["devices"]]
    assert envs[0] == envs[1]
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == f"{u0},{u1}"
    assert envs[0]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=4096M"
    assert envs[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert "TESSERA_PROGRESS_ENDPOINT" not in envs[0]  # no pod reserved it yet


async def test_claims_this_node_cannot_prepare_get_their_reason(
    running: Running, cfg: AgentConfig, api: FakeDraApi
) -> None:
    api.claims[("ml", "pending")] = {"metadata": {"name": "pending", "namespace": "ml", "uid": "uid-p"}}
    api.claims[("ml", "recreated")] = claim("recreated", "uid-new", [result("gpu-0", "1Gi", "10")])
    api.claims[("ml", "elsewhere")] = claim(
        "elsewhere", "uid-e", [{**result("gpu-0", "1Gi", "10"), "pool": "node-b"}]
    )
    api.claims[("ml", "ghost")] = claim("ghost", "uid-g", [result("gpu-7", "1Gi", "10")])
    channel, stub = dra_stub(cfg)
    async with channel:
        got = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=claims(
                    ("ml", "pending", "uid-p"),
                    ("ml", "recreated", "uid-old"),
                    ("ml", "elsewhere", "uid-e"),
                    ("ml", "ghost", "uid-g"),
                    ("ml", "missing", "uid-m"),
                )
            ),
            timeout=DEADLINE_S,
        )
    errors = {uid: c.error for uid, c in got.claims.items()}
    assert "is not allocated" in errors["uid-p"]
    assert "deleted and recreated" in errors["uid-old"]
    assert f"no {contract.DRA_DRIVER} device on node {NODE}" in errors["uid-e"]
    assert "'gpu-7', which node node-a does not have" in errors["uid-g"]
    assert "not found" in errors["uid-m"]
    assert all(not c.devices for c in got.claims.values())
    assert list(cfg.cdi_dir.glob("*.json")) == []


async def test_agent_stopped_mid_prepare_loses_nothing(
    cfg: AgentConfig, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    """The agent dies after recording the claim and before its CDI spec: the next agent knows the claim, the
    kubelet's retry prepares it, and an unprepare of a half-prepared claim removes what it may have left."""
    api.claims[("ml", "c")] = claim("c", "uid-c", [result("gpu-0", "10Gi", "30")])
    first = await start(cfg, backend, api)
    blocked = asyncio.Event()

    async def hang(uid: str) -> None:
        blocked.set()
        await asyncio.Event().wait()  # never returns: the agent is killed here

    first.driver.servicer.before_cdi_write = hang
    channel, stub = dra_stub(cfg)
    async with channel:

        async def prepare() -> dra_v1_pb2.NodePrepareResourcesResponse:
            req = dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(("ml", "c", "uid-c")))
            return await stub.NodePrepareResources(req, timeout=DEADLINE_S)

        call = asyncio.create_task(prepare())
        await asyncio.wait_for(blocked.wait(), DEADLINE_S)
        saved = Checkpoint.load(cfg.dra_plugin_dir / "checkpoint.json")
        assert saved.claims["uid-c"].state == "preparing"
        await first.halt()
        with pytest.raises(grpc.aio.AioRpcError):
            await call

    second = await start(cfg, backend, api)
    try:
        assert second.driver.servicer.checkpoint.claims["uid-c"].state == "preparing"
        channel, stub = dra_stub(cfg)
        async with channel:
            got = await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(("ml", "c", "uid-c"))),
                timeout=DEADLINE_S,
            )
            assert got.claims["uid-c"].error == ""
            assert (
                cdi_env(cfg.cdi_dir / f"{contract.DRA_DRIVER}-uid-c.json")[
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
                ]
                == "30"
            )
            assert Checkpoint.load(cfg.dra_plugin_dir / "checkpoint.json").claims["uid-c"].state == "prepared"

            # a claim half-prepared by a dead agent (spec written, checkpoint not yet updated) is cleaned up
            second.driver.servicer.checkpoint.claims["uid-h"] = second.driver.servicer.checkpoint.claims[
                "uid-c"
            ].model_copy(update={"state": "preparing", "devices": []})
            (cfg.cdi_dir / f"{contract.DRA_DRIVER}-uid-h.json").write_text("{}")
            await stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims(("ml", "h", "uid-h"))),
                timeout=DEADLINE_S,
            )
            assert not (cfg.cdi_dir / f"{contract.DRA_DRIVER}-uid-h.json").exists()
            assert "uid-h" not in Checkpoint.load(cfg.dra_plugin_dir / "checkpoint.json").claims
    finally:
        await second.halt()
    assert not cfg.dra_socket.exists() and not cfg.dra_registration_socket.exists()


async def test_unreadable_checkpoint_is_kept_aside(
    cfg: AgentConfig, api: FakeDraApi, backend: FakeGpuBackend
) -> None:
    cfg.dra_plugin_dir.mkdir(parents=True)
    (cfg.dra_plugin_dir / "checkpoint.json").write_text('{"version": 9}')
    r = await start(cfg, backend, api)
    try:
        assert r.driver.servicer.checkpoint.claims == {}
        assert (cfg.dra_plugin_dir / "checkpoint.unreadable").read_text() == '{"version": 9}'
    finally:
        await r.halt()
