"""A GPU's PCIe root complex and NUMA node, read from a sysfs tree laid out as the kernel lays it out, and
published as the DRA device's pcieRoot and numaNode attributes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tessera.api import contract
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.gpus.pci import numa_node, pcie_root, sysfs_address
from tessera_agent.kubelet.dra_slice import device


def _sysfs(root: Path, chain: list[str], numa: str | None) -> None:
    """/sys/devices/<chain...> as a directory and /sys/bus/pci/devices/<last> linking to it, as the kernel
    lists a function under its bridges."""
    target = root.joinpath("devices", *chain)
    target.mkdir(parents=True)
    if numa is not None:
        (target / "numa_node").write_text(f"{numa}\n")
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / chain[-1]).symlink_to(target)


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [("00000000:3B:00.0", "0000:3b:00.0"), ("0001:c1:00.1", "0001:c1:00.1"), ("3b:00.0", "0000:3b:00.0")],
)
def test_nvml_bus_ids_read_as_sysfs_names_them(bus_id: str, address: str) -> None:
    assert sysfs_address(bus_id) == address


def test_a_bus_id_that_is_no_pci_address_is_refused() -> None:
    with pytest.raises(ValueError, match="not a PCI bus ID"):
        sysfs_address("GPU-1234")


def test_the_root_is_the_host_bridge_above_every_switch(tmp_path: Path) -> None:
    # two GPUs behind a PCIe switch (upstream and downstream ports) under root pci0000:3a, one under pci0000:b1
    _sysfs(tmp_path, ["pci0000:3a", "0000:3a:00.0", "0000:3b:00.0", "0000:3c:08.0", "0000:3d:00.0"], "0")
    _sysfs(tmp_path, ["pci0000:3a", "0000:3a:00.0", "0000:3b:00.0", "0000:3c:10.0", "0000:3e:00.0"], "0")
    _sysfs(tmp_path, ["pci0000:b1", "0000:b1:00.0", "0000:b2:00.0"], "1")
    assert pcie_root("00000000:3D:00.0", tmp_path) == "pci0000:3a"
    assert pcie_root("00000000:3E:00.0", tmp_path) == "pci0000:3a"
    assert pcie_root("00000000:B2:00.0", tmp_path) == "pci0000:b1"
    assert (numa_node("00000000:3D:00.0", tmp_path), numa_node("00000000:B2:00.0", tmp_path)) == (0, 1)


def test_unknown_where_sysfs_does_not_say(tmp_path: Path) -> None:
    _sysfs(tmp_path, ["virtual", "0000:05:00.0"], "-1")  # no host bridge in its path; NUMA unknown
    assert pcie_root("00000000:05:00.0", tmp_path) is None
    assert numa_node("00000000:05:00.0", tmp_path) is None
    assert pcie_root("00000000:06:00.0", tmp_path) is None  # not listed at all
    assert numa_node("00000000:06:00.0", tmp_path) is None


def test_the_slice_carries_the_topology_where_known() -> None:
    gpus = FakeGpuBackend.uniform(4, gpus_per_root=2).gpus()
    attrs = [device(g, slots=4)["attributes"] for g in gpus]
    roots = [a[contract.DRA_ATTRIBUTE_PCIE_ROOT] for a in attrs]
    assert roots == [{"string": "pci0000:00"}] * 2 + [{"string": "pci0000:40"}] * 2
    assert [a[contract.DRA_ATTRIBUTE_NUMA_NODE] for a in attrs] == [{"int": 0}] * 2 + [{"int": 1}] * 2
    # the fake's bus IDs lie under its roots, as NVML's and sysfs' would
    assert [sysfs_address(g.pci_bus_id) for g in gpus] == ["0000:01:00.0", "0000:02:00.0", "0000:41:00.0",
                                                           "0000:42:00.0"]  # fmt: skip
    bare = device(GpuDevice(0, "GPU-x", "A100", 40960 * MIB, 0), slots=4)["attributes"]
    assert contract.DRA_ATTRIBUTE_PCIE_ROOT not in bare and contract.DRA_ATTRIBUTE_NUMA_NODE not in bare
