"""Fuzzing the device plugin's gRPC servicer (issue 19) over a real gRPC server on a unix socket.

Kubelet is trusted, but the servicer must still answer whatever arrives with a result or a clear status
(FAILED_PRECONDITION / INVALID_ARGUMENT with a reason), never UNKNOWN or INTERNAL (an exception escaped) and
never a hang; no log record may carry a traceback. Derandomized; reports how many cases ran.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.plugin import DevicePluginServicer
from tessera_agent.pods import StaticPodSource, pod_info_from_manifest
from tessera_agent.proto import api_pb2, api_pb2_grpc

from tests.integration.agent.peer_support import NODE, ErrorLog, LoopThread

CASES = 250
DEADLINE_S = 5.0
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
ANSWERS = {grpc.StatusCode.OK, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT}
SLOTS = 4


def _pods(uuids: list[str], copies: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(copies):
        for gpus in (1, 2):
            assignment = {
                "node": NODE,
                "gpuUUIDs": uuids[:gpus],
                "gpuIndices": list(range(gpus)),
                "laneId": f"lane-{i}-{gpus}",
                "memoryMiB": 1024,
                "computePercent": 25,
            }
            out.append(
                {
                    "metadata": {
                        "namespace": "ml",
                        "name": f"p{i}-{gpus}",
                        "uid": f"uid-{i}-{gpus}",
                        "annotations": {contract.ANN_ASSIGNMENT: json.dumps(assignment)},
                    },
                    "spec": {"containers": [{"resources": {"limits": {contract.RESOURCE_GPU: str(gpus)}}}]},
                }
            )
    return out


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[api_pb2_grpc.DevicePluginStub, list[str]]]:
    d = Path(tempfile.mkdtemp(prefix="tsg-", dir="/tmp"))
    backend = FakeGpuBackend.uniform(2)
    uuids = [g.uuid for g in backend.gpus()]
    pods = StaticPodSource([pod_info_from_manifest(p) for p in _pods(uuids, 40)])
    cfg = AgentConfig(node_name=NODE, device_plugin_dir=d, slots_per_gpu=SLOTS, progress_socket=d / "p.sock")
    loop = LoopThread()

    async def serve() -> grpc.aio.Server:
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(cfg, backend, pods), server)
        server.add_insecure_port(f"unix://{d / 'plugin.sock'}")
        await server.start()
        return server

    server = loop.run(serve())
    channel = grpc.insecure_channel(f"unix://{d / 'plugin.sock'}")
    yield api_pb2_grpc.DevicePluginStub(channel), uuids
    channel.close()
    loop.run(server.stop(0))
    loop.close()
    shutil.rmtree(d, ignore_errors=True)


def device_ids(uuids: list[str]) -> st.SearchStrategy[str]:
    valid = st.sampled_from([f"{u}::{k}" for u in uuids for k in range(SLOTS)])
    return st.one_of(
        valid,
        st.text(max_size=70),
        st.builds(lambda u, k: f"{u}::{k}", st.sampled_from([*uuids, "", "GPU-x"]), st.text(max_size=4)),
    )


def test_fuzz_device_plugin_servicer(stub: tuple[api_pb2_grpc.DevicePluginStub, list[str]]) -> None:
    plugin, uuids = stub
    ids = st.lists(device_ids(uuids), max_size=6)
    allocate = st.lists(ids, max_size=3).map(
        lambda reqs: (
            "Allocate",
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=r) for r in reqs]
            ),
        )
    )
    preferred = st.lists(
        st.builds(
            lambda a, m, n: api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=a, must_include_deviceIDs=m, allocation_size=n
            ),
            ids,
            ids,
            st.integers(-(2**31), 2**31 - 1) | st.integers(0, 4),
        ),
        max_size=3,
    ).map(
        lambda reqs: ("GetPreferredAllocation", api_pb2.PreferredAllocationRequest(container_requests=reqs))
    )
    prestart = ids.map(lambda r: ("PreStartContainer", api_pb2.PreStartContainerRequest(devices_ids=r)))
    options = st.just(("GetDevicePluginOptions", api_pb2.Empty()))
    ran: list[str] = []

    @FUZZ
    @given(call=st.one_of(allocate, preferred, prestart, options))
    def case(call: tuple[str, object]) -> None:
        method, request = call
        try:
            getattr(plugin, method)(request, timeout=DEADLINE_S)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            assert err.details(), (method, code)  # type: ignore[attr-defined]
        assert code in ANSWERS, (method, code, request)
        ran.append(method)

    with ErrorLog() as errors:
        case()
    assert not errors.messages(), errors.messages()
    print(f"device plugin servicer: {len(ran)} generated cases ({', '.join(sorted(set(ran)))})")
    assert len(ran) >= 200
