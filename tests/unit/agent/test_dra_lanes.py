"""A claim's results as the driver reads them (issue 40): the per-GPU sum of its shares, CDI device names that
stay distinct whatever the allocation's shape, and admin-access results as observers."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.api import contract
from tessera_agent.gpus.backend import usable_memory_mib
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.dra_lanes import (
    ClaimError,
    LaneDevice,
    ResourceClaim,
    cdi_device_names,
    gpu_shares,
    is_observer,
    lane_devices,
    lane_limits,
)

NODE = "node-a"


def parsed(*results: dict[str, Any]) -> ResourceClaim:
    return ResourceClaim.model_validate(
        {
            "metadata": {"name": "c", "namespace": "ml", "uid": "uid-c"},
            "status": {"allocation": {"devices": {"results": list(results)}}},
        }
    )


def res(device: str, memory: str | None, compute: str | None, **extra: Any) -> dict[str, Any]:
    consumed = {k: v for k, v in (("memory", memory), ("computeShare", compute)) if v is not None}
    return {
        "request": extra.pop("request", "gpu"),
        "driver": contract.DRA_DRIVER,
        "pool": NODE,
        "device": device,
        "consumedCapacity": consumed,
        **extra,
    }


def devices_of(claim: ResourceClaim) -> list[LaneDevice]:
    gpus = FakeGpuBackend.uniform(2).gpus()
    return lane_devices(claim, NODE, gpus, {g.uuid: usable_memory_mib(g) for g in gpus})


def test_the_shares_of_one_gpu_are_summed_and_the_percentage_is_the_smallest_gpus() -> None:
    devices = devices_of(
        parsed(res("gpu-0", "3Gi", "20", request="a"), res("gpu-1", "1Gi", "35"), res("gpu-0", "1Gi", "25"))
    )
    u0, u1 = devices[0].uuid, devices[1].uuid
    assert gpu_shares(devices) == {u0: (4096, 45), u1: (1024, 35)}
    limits = lane_limits(devices)
    assert (limits.gpus, limits.memory_mib, limits.thread_percent) == ((u0, u1), (4096, 1024), 35)


def test_a_whole_device_result_beside_a_share_of_it_is_more_than_the_gpu() -> None:
    # No consumed capacity: the whole GPU (an allocator without consumable capacity); with another share
    # of it the claim holds more than the GPU has.
    with pytest.raises(ClaimError, match=r"its shares of gpu-1 add up to 41472 MiB, more than the 40448 MiB"):
        devices_of(parsed(res("gpu-1", None, None), res("gpu-1", "1Gi", "10", request="b")))


def test_cdi_device_names_are_distinct_for_every_shape() -> None:
    one = [LaneDevice(request="a", device="gpu-0", uuid="G0", memory_mib=1, compute_percent=1, share_id="s1")]
    assert cdi_device_names("u", one) == ["u-gpu-0"]  # the name a single share always had
    shares = [
        LaneDevice(request=r, device=d, uuid="G", memory_mib=1, compute_percent=1, share_id=s)
        for r, d, s in (("a", "gpu-0", "s1"), ("b", "gpu-1", "s2"), ("c", "gpu-0", "s3"))
    ]
    assert cdi_device_names("u", shares) == ["u-gpu-0-s1", "u-gpu-1", "u-gpu-0-s3"]
    unshared = [s.model_copy(update={"share_id": None}) for s in shares]
    assert cdi_device_names("u", unshared) == ["u-gpu-0-1", "u-gpu-1", "u-gpu-0-2"]


def test_admin_access_results_are_observers_with_no_share() -> None:
    devices = devices_of(parsed(res("gpu-0", "40448Mi", "100", adminAccess=True, shareID="s1")))
    assert is_observer(devices) and gpu_shares(devices) == {}
    assert (devices[0].memory_mib, devices[0].compute_percent, devices[0].share_id) == (0, 0, "s1")
    with pytest.raises(ValueError, match="no lane limits"):
        lane_limits(devices)
    # adminAccess false is an ordinary share
    assert not is_observer(devices_of(parsed(res("gpu-0", "1Gi", "10", adminAccess=False))))
