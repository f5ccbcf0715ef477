"""Where a GPU sits on the PCI Express fabric: its root complex and NUMA node, read from sysfs by its bus ID.

NVML names a GPU's PCI address (`nvmlDeviceGetPciInfo`'s busId, e.g. `00000000:3B:00.0`: an 8-digit domain,
upper case). The kernel lists every PCI function under `/sys/bus/pci/devices/<dddd:bb:dd.f>` as a link into
`/sys/devices`, whose path walks the hierarchy from the host bridge down:
`/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0`. Its first component, `pci<domain>:<bus>`, is the root
complex (the domain and bus of the root port's host bridge): two GPUs under the same one talk peer to peer
without crossing the CPU interconnect, which is what a claim's `matchAttribute: pcieRoot` asks for.
"""

from __future__ import annotations

import re
from pathlib import Path

SYSFS = Path("/sys")
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def sysfs_address(bus_id: str) -> str:
    """NVML's bus ID as sysfs spells it: `00000000:3B:00.0` -> `0000:3b:00.0` (domain of 4 digits, lower
    case). ValueError for anything that is not a PCI address."""
    m = _BUS_ID.match(bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus ID: {bus_id!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def pcie_root(bus_id: str, sysfs: Path = SYSFS) -> str | None:
    """The root complex above the device, `pci<domain>:<bus>` as sysfs names it; None where sysfs does not
    list the device or its path names no host bridge (a virtual device)."""
    link = sysfs / "bus" / "pci" / "devices" / sysfs_address(bus_id)
    try:
        real = link.resolve(strict=True)
    except OSError:
        return None
    return next((part for part in real.parts if _ROOT.match(part)), None)


def numa_node(bus_id: str, sysfs: Path = SYSFS) -> int | None:
    """The NUMA node the kernel puts the device on; None where it does not know (-1, or no file)."""
    path = sysfs / "bus" / "pci" / "devices" / sysfs_address(bus_id) / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
