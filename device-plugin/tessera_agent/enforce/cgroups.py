"""The host's cgroup v2 hierarchy as the agent writes it: where it is mounted, each pod's cgroup in it, and the
nested-keyed files (`<key> <value>` per line, `max` for no limit) the dmem controller reads and writes.

On a pure v2 host the hierarchy is mounted at /sys/fs/cgroup; on a hybrid (v1 + v2) host systemd mounts it
at /sys/fs/cgroup/unified. The agent is given the host's /sys/fs/cgroup (the chart mounts it) or finds the
cgroup2 mount in /proc/self/mountinfo.

kubelet names a pod's cgroup after the pod's UID, below its kubepods cgroup and (for Burstable and
BestEffort pods) a QoS cgroup:

    cgroupfs: /kubepods/burstable/pod1f2e3d4c-0000-4000-8000-000000000000
    systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_0000_....slice

(Guaranteed pods sit directly under kubepods; a kubelet with a --cgroup-root, or kind's, nests kubepods one
level deeper, e.g. /kubelet.slice/kubelet-kubepods.slice/.) The pod is found by walking only kubelet's
directories and reading each name with the peer check's parser (`lanes.peers`), so a directory a workload
creates inside its own cgroup is never taken for a pod.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from tessera_agent.lanes.peers import pod_uid_of_cgroup_name

SYS_FS_CGROUP = Path("/sys/fs/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")
_KUBELET_LEVELS = 4  # [kubelet.slice/] kubepods / qos / pod
_QOS = frozenset({"burstable", "besteffort"})

NestedKeyed = dict[str, int | None]  # key → bytes; None: `max`


class CgroupError(RuntimeError):
    """A cgroup file could not be read or written; the message names it and why."""


def cgroup2_root(fs_root: Path | None = None, mountinfo: Path = MOUNTINFO) -> Path | None:
    """The root of the cgroup v2 hierarchy: under `fs_root` (the host's /sys/fs/cgroup as mounted for the
    agent; itself on v2, `unified/` on a hybrid host), else the first cgroup2 mount in `mountinfo`; None
    where there is none (a v1-only host)."""
    if fs_root is not None:
        for candidate in (fs_root, fs_root / "unified"):
            if (candidate / "cgroup.controllers").is_file():
                return candidate
        return None
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    mounts = []
    for line in lines:
        # "<id> <parent> <maj:min> <root> <mount point> <options> [optional fields...] - <fstype> <source> ..."
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5 or rest.split()[:1] != ["cgroup2"]:
            continue
        mounts.append(Path(_unescape(parts[4])))
    # the host's own mount point first, should the agent see several
    for preferred in (SYS_FS_CGROUP, SYS_FS_CGROUP / "unified"):
        if preferred in mounts:
            return preferred
    return mounts[0] if mounts else None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
    return field.encode().decode("unicode_escape") if "\\" in field else field


def pod_cgroup(root: Path, pod_uid: str) -> Path | None:
    """The pod-level cgroup kubelet made for `pod_uid` under `root`, with either driver; None when there is
    none (not yet created, or gone)."""
    for uid, path in kubelet_pod_cgroups(root):
        if uid == pod_uid:
            return path
    return None


def kubelet_pod_cgroups(root: Path) -> Iterator[tuple[str, Path]]:
    """Every pod cgroup under kubelet's directories: (pod UID, its directory)."""
    for parent in kubelet_cgroups(root):
        for child in subdirs(parent):
            uid = pod_uid_of_cgroup_name(child.name)
            if uid is not None:
                yield uid, child


def kubelet_cgroups(root: Path) -> list[Path]:
    """kubelet's own cgroups above the pods (kubepods, its QoS cgroups, a kubelet slice around them), deepest
    first; never a pod's, nor anything below one."""
    found: list[Path] = []
    level = [root]
    for _ in range(_KUBELET_LEVELS):
        level = [d for parent in level for d in subdirs(parent) if _is_kubelet_dir(d.name)]
        found.extend(level)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _is_kubelet_dir(name: str) -> bool:
    if pod_uid_of_cgroup_name(name) is not None:
        return False
    return "kubepods" in name or name in _QOS or name.startswith("kubelet")


def subdirs(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return [path / e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def ancestors(path: Path, root: Path) -> list[Path]:
    """The cgroups between `path` and `root`, both excluded, nearest first."""
    out = []
    for parent in path.parents:
        if parent == root or len(parent.parts) <= len(root.parts):
            break
        out.append(parent)
    return out


def parse_nested_keyed(text: str) -> NestedKeyed:
    """A nested-keyed cgroup file (`<key> <value>` per line, the value a number or `max`)."""
    out: NestedKeyed = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if not key or not value:
            continue
        out[key] = None if value == "max" else int(value)
    return out


def read_nested_keyed(path: Path) -> NestedKeyed:
    try:
        return parse_nested_keyed(path.read_text())
    except (OSError, ValueError) as err:
        raise CgroupError(f"cannot read {path}: {err}") from None


def write_nested_keyed(path: Path, values: Mapping[str, int | None]) -> None:
    """Set each key's value in one write: the kernel reads every line of a write (`<key> <bytes|max>`), and a
    file of one region per line is then what a reader sees."""
    text = "".join(f"{k} {'max' if v is None else v}\n" for k, v in values.items())
    try:
        with path.open("w") as f:
            f.write(text)
    except OSError as err:
        raise CgroupError(f"cannot write {path} ({text.strip()!r}): {err}") from None


def enable_controller(root: Path, path: Path, controller: str) -> list[Path]:
    """Have `controller` reach `path`: `+<controller>` in cgroup.subtree_control of every cgroup from `root`
    down to its parent that lacks it (the chain must be unbroken). Returns the cgroups written."""
    written = []
    chain = [root, *reversed(ancestors(path, root))]
    for cg in chain:
        control = cg / "cgroup.subtree_control"
        try:
            enabled = control.read_text().split()
        except OSError as err:
            raise CgroupError(f"cannot read {control}: {err}") from None
        if controller in enabled:
            continue
        try:
            control.write_text(f"+{controller}\n")
        except OSError as err:
            raise CgroupError(f"cannot enable {controller} in {control}: {err}") from None
        written.append(cg)
    return written
