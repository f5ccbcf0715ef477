"""Each lane's GPU memory held by the kernel: the cgroup v2 `dmem` controller's limits on the lane's pod cgroups
(docs/mps-v3.md, section 2; docs/node-agent.md, "What a tenant can and cannot do").

The kernel's interface: the root cgroup's `dmem.capacity` lists each device memory region a driver registered
(`<region> <bytes>`); every other cgroup has `dmem.max` (hard limit) and `dmem.min` (protection), nested-keyed
`<region> <bytes|max>`, once `+dmem` is in its parent's cgroup.subtree_control. The NVIDIA driver registers one
region per GPU, `nvidia/<PCI bus id with an 8-digit domain>/vidmem`.

On a pod's cgroup, `dmem.max` bounds every container of the pod together, hierarchically, whatever the pod does
inside its own cgroups: a tenant sending its own MPS daemon control commands cannot allocate past it. `dmem.min`
(on by default) guarantees the share: the kernel honours a cgroup's protection only as far as every ancestor's
`dmem.min` covers its subtree, so each ancestor between the root and the pods (kubepods, its QoS cgroups) is kept
at the sum of its children's; a pod's `dmem.min` is zeroed when its lane goes (its cgroup may outlive it, and a
deleted cgroup's ancestors are only lowered by recomputing them).

What was written survives the agent: the pods it holds limits for are kept in a small state file (under
--mps-root, on the host), so a restarted agent re-applies the live ones and zeroes the ones gone meanwhile.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tessera_agent.enforce.cgroups import (
    MOUNTINFO,
    CgroupError,
    ancestors,
    cgroup2_root,
    enable_controller,
    kubelet_cgroups,
    pod_cgroup,
    read_nested_keyed,
    subdirs,
    write_nested_keyed,
)
from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.gpus.pci import sysfs_address

log = logging.getLogger(__name__)

DmemMode = Literal["auto", "required", "off"]
CONTROLLER = "dmem"
_NVIDIA_REGION = re.compile(r"^nvidia/([^/\s]+)/vidmem$")
FIX = (
    "dmem needs cgroup v2, Linux 6.14 or later with the dmem controller (not cgroup_disable=dmem), an NVIDIA "
    "driver that registers its GPUs with it (r615 or later, not MIG), and the host's /sys/fs/cgroup mounted "
    "for the agent (--cgroup-root); or run with --dmem auto|off (chart agent.dmem.mode)"
)


class DmemUnavailable(RuntimeError):
    """The node does not offer dmem limits for its GPUs; the message says what is missing."""


class DmemError(RuntimeError):
    """A pod's dmem limits could not be written; the message says which and why."""


def parse_capacity(text: str) -> dict[str, int]:
    """`dmem.capacity`: region → bytes."""
    out = {}
    for line in text.splitlines():
        region, _, size = line.strip().partition(" ")
        if region and size.strip().isdigit():
            out[region] = int(size)
    return out


def gpu_regions(gpus: Sequence[GpuDevice], capacity: Mapping[str, int]) -> dict[str, str]:
    """GPU UUID → its region, spelled as the kernel lists it (a write must name it exactly); the bus IDs
    compared as addresses (NVML's `00000000:3B:00.0` is the driver's `00000000:3b:00.0`). DmemUnavailable
    naming each GPU without one."""
    by_address: dict[str, str] = {}
    for name in capacity:
        m = _NVIDIA_REGION.match(name)
        if m is None:
            continue
        try:
            by_address[sysfs_address(m.group(1))] = name
        except ValueError:
            continue
    out: dict[str, str] = {}
    missing: list[str] = []
    for gpu in gpus:
        region: str | None
        try:
            region = by_address.get(sysfs_address(gpu.pci_bus_id))
        except ValueError:
            region = None
        if region is None:
            missing.append(f"{gpu.uuid} ({gpu.pci_bus_id or 'no PCI bus ID'})")
        else:
            out[gpu.uuid] = region
    if missing:
        listed = ", ".join(sorted(capacity)) or "none"
        raise DmemUnavailable(
            f"dmem.capacity has no region for GPU {', '.join(missing)} (it lists: {listed})"
        )
    return out


@dataclass(frozen=True)
class DmemNode:
    """dmem as this node offers it: the cgroup v2 root and each GPU's region."""

    root: Path
    regions: dict[str, str]  # GPU UUID → region
    capacity: dict[str, int]  # region → bytes


def detect(gpus: Sequence[GpuDevice], fs_root: Path | None = None, mountinfo: Path = MOUNTINFO) -> DmemNode:
    """What dmem offers for `gpus`; DmemUnavailable with the reason where it offers nothing usable."""
    root = cgroup2_root(fs_root, mountinfo)
    if root is None:
        where = f"under {fs_root}" if fs_root is not None else f"in {mountinfo}"
        raise DmemUnavailable(f"no cgroup v2 hierarchy {where}")
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
    except OSError as err:
        raise DmemUnavailable(f"cannot read {root / 'cgroup.controllers'}: {err}") from None
    if CONTROLLER not in controllers:
        raise DmemUnavailable(
            f"the kernel offers no dmem controller ({root}/cgroup.controllers: {' '.join(controllers)})"
        )
    try:
        capacity = parse_capacity((root / "dmem.capacity").read_text())
    except OSError as err:
        raise DmemUnavailable(f"cannot read {root / 'dmem.capacity'}: {err}") from None
    if not gpus:
        raise DmemUnavailable("no GPUs")
    return DmemNode(root, gpu_regions(gpus, capacity), capacity)


@dataclass(frozen=True)
class PodMemory:
    """What one pod's cgroup is held to, per GPU UUID: its lanes' memory as a hard limit, and the part of it
    that is guaranteed (a lane shared by several pods guarantees none: their protections would add up past
    the lane)."""

    max_mib: dict[str, int]
    min_mib: dict[str, int] = field(default_factory=dict)


@dataclass
class DmemLimits:
    """Writes and removes pods' dmem limits, keeping the ancestors' protection equal to what is below them."""

    node: DmemNode
    guarantee: bool = True  # dmem.min = the lane's memory; off: no dmem.min is written anywhere
    state_path: Path | None = None
    _pods: dict[str, Path] = field(default_factory=dict)  # pod UID → its cgroup, for every pod limited

    def __post_init__(self) -> None:
        if self.state_path is not None:
            self._pods = _load_state(self.state_path)

    @property
    def pods(self) -> dict[str, Path]:
        return dict(self._pods)

    def values(self, memory: PodMemory) -> tuple[dict[str, int | None], dict[str, int | None]]:
        """(dmem.max, dmem.min) lines for `memory`, region → bytes, for every GPU of the node: one the pod holds
        no lane on is back at the kernel's defaults (`max`, 0), as after a lane of the pod went."""
        unknown = (set(memory.max_mib) | set(memory.min_mib)) - set(self.node.regions)
        if unknown:
            raise DmemError(f"no dmem region for GPU {', '.join(sorted(unknown))}")
        hard: dict[str, int | None] = dict.fromkeys(self.node.regions.values(), None)
        soft: dict[str, int | None] = dict.fromkeys(self.node.regions.values(), 0)
        hard.update({self.node.regions[u]: mib * MIB for u, mib in memory.max_mib.items()})
        soft.update({self.node.regions[u]: mib * MIB for u, mib in memory.min_mib.items()})
        return hard, soft

    def apply(self, pod_uid: str, memory: PodMemory) -> Path:
        """Write the pod's limits on its pod cgroup and settle its ancestors; the cgroup written. DmemError
        when the pod has no cgroup (yet) or a file cannot be written."""
        cg = pod_cgroup(self.node.root, pod_uid)
        if cg is None:
            raise DmemError(f"pod {pod_uid} has no pod cgroup under {self.node.root}")
        hard, soft = self.values(memory)
        try:
            enabled = enable_controller(self.node.root, cg, CONTROLLER)
            if enabled:
                log.info("dmem enabled in cgroup.subtree_control of %s", ", ".join(map(str, enabled)))
            if not (cg / "dmem.max").is_file():
                raise DmemError(f"{cg} has no dmem.max although dmem is enabled above it")
            if _differs(cg / "dmem.max", hard):
                write_nested_keyed(cg / "dmem.max", hard)
            if self.guarantee and _differs(cg / "dmem.min", soft):
                write_nested_keyed(cg / "dmem.min", soft)
        except CgroupError as err:
            raise DmemError(str(err)) from None
        if self._pods.get(pod_uid) != cg:
            self._pods[pod_uid] = cg
            self._save()
        if self.guarantee:
            self._settle(ancestors(cg, self.node.root))
        return cg

    def release(self, pod_uid: str) -> None:
        """The pod's lanes went: its protection zeroed (when its cgroup is still there) and its ancestors
        settled. Its hard limit stays on a cgroup that only ends with the pod."""
        cg = self._pods.get(pod_uid)
        if cg is None:
            return
        if self.guarantee and (cg / "dmem.min").is_file():
            zero: dict[str, int | None] = dict.fromkeys(self.node.regions.values(), 0)
            try:
                if _differs(cg / "dmem.min", zero):
                    write_nested_keyed(cg / "dmem.min", zero)
            except CgroupError as err:
                raise DmemError(str(err)) from None
        del self._pods[pod_uid]
        self._save()
        if self.guarantee:
            self._settle(ancestors(cg, self.node.root))
        log.info("pod %s: dmem protection released", pod_uid)

    def settle_all(self) -> None:
        """Every kubelet cgroup above the pods at the sum of its children's protection (after a restart, or
        pods gone while nothing was watching)."""
        if self.guarantee:
            self._settle(kubelet_cgroups(self.node.root))

    def _settle(self, cgroups: Iterable[Path]) -> None:
        """Each cgroup's dmem.min, for this node's regions, set to the sum of its children's; deepest first,
        so a parent sums what its children were just given."""
        regions = list(self.node.regions.values())
        for cg in sorted(set(cgroups), key=lambda p: len(p.parts), reverse=True):
            if not (cg / "dmem.min").is_file():
                continue
            total = dict.fromkeys(regions, 0)
            for child in subdirs(cg):  # a pod's cgroup may go while it is read: then it counts for nothing
                if not (child / "dmem.min").is_file():
                    continue
                try:
                    got = read_nested_keyed(child / "dmem.min")
                except CgroupError as err:
                    log.warning("%s", err)
                    continue
                for r in regions:
                    v = got.get(r, 0)
                    total[r] += self.node.capacity.get(r, 0) if v is None else v
            want: dict[str, int | None] = dict(total)
            try:
                if _differs(cg / "dmem.min", want):
                    write_nested_keyed(cg / "dmem.min", want)
            except CgroupError as err:
                raise DmemError(str(err)) from None

    def _save(self) -> None:
        if self.state_path is None:
            return
        from tessera_agent.kubelet.dra_lanes import write_atomically

        data = {"version": 1, "pods": {uid: str(cg) for uid, cg in sorted(self._pods.items())}}
        write_atomically(self.state_path, json.dumps(data, indent=1).encode())


def _differs(path: Path, want: Mapping[str, int | None]) -> bool:
    """Whether the file's lines for `want`'s regions hold other values (or it cannot be read)."""
    try:
        have = read_nested_keyed(path)
    except CgroupError:
        return True
    return any(have.get(k, -1) != v for k, v in want.items())


def _load_state(path: Path) -> dict[str, Path]:
    try:
        data = json.loads(path.read_text())
        return {str(uid): Path(cg) for uid, cg in dict(data["pods"]).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.error("dmem state %s unreadable (%s); starting without it", path, err)
        return {}
