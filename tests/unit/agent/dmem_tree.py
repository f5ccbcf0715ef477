"""A fake host cgroup v2 tree with the dmem controller, laid out as the kernel and kubelet lay it out.

The kernel's files as Documentation/admin-guide/cgroup-v2.rst ("DMEM") describes them: the root has
`cgroup.controllers`, `cgroup.subtree_control` and `dmem.capacity` (`<region> <bytes>` per line); every other
cgroup whose parent enables dmem has `dmem.max`, `dmem.min` and `dmem.low` (`<region> <bytes|max>` per line,
`max` / `0` when nothing was written). NVIDIA's regions are `nvidia/<8-digit domain bus id>/vidmem`, lower case.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

# One region line as the kernel reads it back: a registered region name, then bytes or `max`.
KERNEL_LINE = re.compile(r"^nvidia/[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]/vidmem (?:[0-9]+|max)$")
GIB = 1024**3
# FakeGpuBackend.uniform's GPUs sit at NVML bus IDs 00000000:01:00.0, 00000000:02:00.0, 00000000:41:00.0, ...
REGIONS = [
    "nvidia/00000000:01:00.0/vidmem",
    "nvidia/00000000:02:00.0/vidmem",
    "nvidia/00000000:41:00.0/vidmem",
]

Driver = Literal["systemd", "cgroupfs"]
Qos = Literal["guaranteed", "burstable", "besteffort"]


def host(
    sys_fs_cgroup: Path,
    *,
    layout: Literal["v2", "hybrid"] = "v2",
    regions: Sequence[str] = REGIONS,
    controllers: str = "cpuset cpu io memory hugetlb pids rdma misc dmem",
) -> Path:
    """A host's /sys/fs/cgroup; the cgroup v2 root it holds (itself, or unified/ on a hybrid host)."""
    root = sys_fs_cgroup / "unified" if layout == "hybrid" else sys_fs_cgroup
    root.mkdir(parents=True, exist_ok=True)
    if layout == "hybrid":
        (sys_fs_cgroup / "memory").mkdir(exist_ok=True)  # a v1 hierarchy beside it
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("cpu memory dmem\n" if "dmem" in controllers else "cpu\n")
    (root / "dmem.capacity").write_text("".join(f"{r} {80 * GIB}\n" for r in regions))
    return root


def cgroup(path: Path, regions: Sequence[str] = REGIONS, *, subtree: str = "cpu memory dmem") -> Path:
    """A non-root cgroup as the kernel makes it, its dmem files at their defaults."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.subtree_control").write_text(subtree + "\n")
    for name, default in (("dmem.max", "max"), ("dmem.min", "0"), ("dmem.low", "0")):
        if not (path / name).exists():
            (path / name).write_text("".join(f"{r} {default}\n" for r in regions))
    return path


def pod_path(
    root: Path, uid: str, *, driver: Driver = "systemd", qos: Qos = "burstable", kind: bool = False
) -> Path:
    """Where kubelet puts the pod's cgroup (kind nests kubepods in kubelet.slice)."""
    if driver == "systemd":
        prefix = "kubelet-kubepods" if kind else "kubepods"
        base = root / "kubelet.slice" if kind else root
        top = base / f"{prefix}.slice"
        if qos == "guaranteed":
            return top / f"{prefix}-pod{uid.replace('-', '_')}.slice"
        return top / f"{prefix}-{qos}.slice" / f"{prefix}-{qos}-pod{uid.replace('-', '_')}.slice"
    top = root / "kubelet" / "kubepods" if kind else root / "kubepods"
    return top / f"pod{uid}" if qos == "guaranteed" else top / qos / f"pod{uid}"


def pod(root: Path, uid: str, **kw: object) -> Path:
    """The pod's cgroup and every cgroup above it, made as kubelet makes them, with a container below it."""
    path = pod_path(root, uid, **kw)  # type: ignore[arg-type]
    chain = [p for p in reversed(path.parents) if len(p.parts) > len(root.parts)]
    for cg in [*chain, path]:
        cgroup(cg)
    cgroup(path / "cri-containerd-0123abcd.scope", subtree="")
    return path


def lines(path: Path) -> dict[str, str]:
    """A nested-keyed file as the kernel shows it; every line in the kernel's format."""
    text = path.read_text()
    out = {}
    for line in text.splitlines():
        assert KERNEL_LINE.match(line), f"{path}: {line!r} is not a dmem line the kernel accepts"
        region, value = line.split(" ")
        out[region] = value
    return out


def uid(n: int) -> str:
    return f"1f2e3d4c-0000-4000-8000-{n:012d}"
