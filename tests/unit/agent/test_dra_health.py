"""Which taints a starting agent takes back from its published slice (`SlicePublisher`), and the node's boot
time it judges them by."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tessera.api import contract
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_plugin import DraApi, SlicePublisher, node_boot_time
from tessera_agent.kubelet.dra_slice import resource_slice

NODE = "node-a"
BOOT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class SliceOnly(DraApi):
    """One stored slice; a put stores what it is given, at a new resourceVersion."""

    def __init__(self, stored: dict[str, Any] | None) -> None:
        self.stored = stored

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("no claims here")

    async def node_uid(self, node: str) -> str | None:
        return None

    async def get_slice(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.stored)

    async def put_slice(self, body: dict[str, Any], *, create: bool) -> dict[str, Any]:
        assert create == (self.stored is None)
        self.stored = copy.deepcopy(body)
        self.stored["metadata"]["resourceVersion"] = str(int(body["metadata"].get("resourceVersion", 0)) + 1)
        return copy.deepcopy(self.stored)


def published(backend: FakeGpuBackend, tainted: int, time_added: str | None) -> dict[str, Any]:
    """The slice an agent left behind, GPU `tainted` unhealthy since `time_added`."""
    health = {g.uuid: g.index != tainted for g in backend.gpus()}
    body = resource_slice(NODE, backend, slots=4, generation=3, health=health)
    if time_added:
        body["spec"]["devices"][tainted]["taints"][0]["timeAdded"] = time_added
    body["metadata"]["resourceVersion"] = "7"
    return body


def start(tmp_path: Path, stored: dict[str, Any]) -> tuple[SlicePublisher, SliceOnly]:
    cfg = AgentConfig(node_name=NODE, slots_per_gpu=4, mps_root=tmp_path / "mps")
    api = SliceOnly(stored)
    return SlicePublisher(cfg, FakeGpuBackend.uniform(2), api, boot_time=BOOT), api


@pytest.mark.parametrize(
    ("time_added", "kept"),
    [("2026-11-29T12:00:01Z", True), (None, True), ("2026-11-29T11:59:59Z", False)],
)
def test_a_taint_is_taken_back_unless_the_node_booted_since(
    tmp_path: Path, time_added: str | None, kept: bool
) -> None:
    publisher, api = start(tmp_path, published(FakeGpuBackend.uniform(2), 1, time_added))
    asyncio.run(publisher.publish())
    assert api.stored is not None
    devices = api.stored["spec"]["devices"]
    assert [t["key"] for t in devices[1].get("taints", [])] == (
        [contract.DRA_TAINT_UNHEALTHY] if kept else []
    )
    assert "taints" not in devices[0]
    # unchanged, the slice keeps its generation; the taint dropped, the pool moves on
    assert api.stored["spec"]["pool"]["generation"] == (3 if kept else 4)


def test_a_health_event_since_the_start_outweighs_the_old_taint(tmp_path: Path) -> None:
    backend = FakeGpuBackend.uniform(2)
    publisher, api = start(tmp_path, published(backend, 0, "2026-11-29T13:00:00Z"))
    assert not publisher.set_health(backend.gpus()[0].uuid, True)  # healthy already: nothing to publish
    asyncio.run(publisher.publish())
    assert api.stored is not None
    assert "taints" not in api.stored["spec"]["devices"][0]


def test_the_boot_time_is_the_kernels_btime(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1795921937\nprocesses 9\n")
    assert node_boot_time(tmp_path) == datetime.fromtimestamp(1795921937, UTC)
    assert node_boot_time(tmp_path / "absent") is None


def test_a_taint_removed_by_hand_clears_the_gpu_and_a_slice_deleted_whole_does_not(tmp_path: Path) -> None:
    """NVML reports no recovery: a person removing the taint from the slice says the GPU is repaired."""
    publisher, api = start(tmp_path, published(FakeGpuBackend.uniform(2), 1, None))
    asyncio.run(publisher.publish())
    uuid = FakeGpuBackend.uniform(2).gpus()[1].uuid
    assert not publisher.health[uuid]

    api.stored = None  # the kubelet removed the slice: published again as it was
    asyncio.run(publisher.publish())
    assert api.stored is not None
    assert [t["key"] for t in api.stored["spec"]["devices"][1]["taints"]] == [contract.DRA_TAINT_UNHEALTHY]

    del api.stored["spec"]["devices"][1]["taints"]  # kubectl edit
    asyncio.run(publisher.publish())
    assert publisher.health[uuid]
    assert "taints" not in api.stored["spec"]["devices"][1]
    assert api.stored["spec"]["devices"][1]["attributes"]["health"] == {"string": "Healthy"}
