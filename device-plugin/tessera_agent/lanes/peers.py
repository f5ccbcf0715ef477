"""Who is on the other end of a node socket: peer credentials mapped to the pod the process runs in.

The kernel reports a unix socket peer's pid, uid and gid (`SO_PEERCRED`, taken at connect time and not
forgeable by the client). The pod is then read from `/proc/<pid>/cgroup`: kubelet puts every container under
a cgroup named after its pod's UID, in one of two forms

    cgroupfs: /kubepods/burstable/pod1f2e3d4c-0000-4000-8000-000000000000/<container id>
    systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_0000_....slice/cri-...

(cgroup v1 lists one such line per controller, v2 a single `0::<path>` line; seen from the agent's own
cgroup namespace a path may start with `/../..`). Only the first component in a pod form counts, so a
process that may create sub-cgroups of its own (cgroup namespaces, delegation) cannot name another pod by
nesting a directory called `pod<other uid>` under its own.

The agent must share the host's PID namespace (the chart's `hostPID: true`): `SO_PEERCRED` reports the pid as
seen from the agent's namespace, 0 when the peer's is not visible, which is refused.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera_agent.pods import NodePod, PodSource

log = logging.getLogger(__name__)

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_CGROUPFS_POD = re.compile(rf"pod({_UID})")
# systemd driver: [<prefix>-]kubepods[-<qos class>]-pod<uid with _>.slice (kind nests it under kubelet-)
_SYSTEMD_POD = re.compile(rf"(?:[a-z]+-)*kubepods(?:-[a-z]+)?-pod({_UID})\.slice")


class PeerRefused(PermissionError):
    """A peer that may not act for the pod or lane it asked for, with the reason (sent back as the error)."""


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid {self.pid} (uid {self.uid}, gid {self.gid})"


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """`SO_PEERCRED` of a connected unix stream socket (Linux `struct ucred`: three 32-bit ints)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCredentials(pid, uid, gid)


def credentials_of_transport(transport: Any) -> PeerCredentials:
    """Peer credentials of an asyncio transport over a unix socket; PeerRefused when there are none."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        raise PeerRefused("the peer's credentials are unknown (not a unix socket connection)")
    try:
        return peer_credentials(sock)
    except OSError as err:
        raise PeerRefused(f"cannot read the peer's credentials: {err}") from err


def pod_uid_from_cgroup_text(text: str) -> str | None:
    """The pod UID kubelet's cgroup path names in a `/proc/<pid>/cgroup` text, or None when there is none.

    Every line that names a pod must name the same one; a process whose lines disagree is not trusted.
    """
    found: set[str] = set()
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        uid = _pod_uid_in_path(path)
        if uid is not None:
            found.add(uid)
    if len(found) != 1:
        if len(found) > 1:
            log.warning("cgroup paths name several pods (%s); trusting none", ", ".join(sorted(found)))
        return None
    return found.pop()


def _pod_uid_in_path(path: str) -> str | None:
    # kubelet's pod component precedes anything the workload could create below its own cgroup, so the first
    # component in a pod form is the pod; anything later is ignored
    for part in path.split("/"):
        uid = pod_uid_of_cgroup_name(part)
        if uid is not None:
            return uid
    return None


def pod_uid_of_cgroup_name(name: str) -> str | None:
    """The pod UID a single cgroup directory name is kubelet's pod cgroup for (`pod<uid>` with the cgroupfs
    driver, `kubepods[-<qos>]-pod<uid with _>.slice` with systemd's), else None."""
    m = _SYSTEMD_POD.fullmatch(name) or _CGROUPFS_POD.fullmatch(name)
    return m.group(1).replace("_", "-") if m else None


def pod_uid_of_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The pod UID of a process from `<proc_root>/<pid>/cgroup`; None when outside any pod or gone."""
    if pid <= 0:
        return None
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    return pod_uid_from_cgroup_text(text)


class PeerResolver:
    """Maps a connection's credentials to the pod on this node that the peer process belongs to."""

    def __init__(self, node: str, pods: PodSource, *, proc_root: Path = Path("/proc")) -> None:
        self.node = node
        self.pods = pods
        self.proc_root = proc_root

    async def pod_of(self, creds: PeerCredentials) -> NodePod:
        uid = pod_uid_of_pid(creds.pid, self.proc_root)
        if uid is None:
            raise PeerRefused(f"{creds} is not in a pod (no pod cgroup) on node {self.node}")
        pod = next((p for p in await self.pods.pods_on_node(self.node) if p.uid == uid), None)
        if pod is None:
            raise PeerRefused(f"{creds} belongs to pod UID {uid}, which is not on node {self.node}")
        return pod


def lane_of(pod: NodePod) -> str:
    """The lane a pod was assigned (its `tessera.io/assignment`); PeerRefused when it holds none."""
    if pod.assignment is None:
        reason = f" ({pod.assignment_error})" if pod.assignment_error else ""
        raise PeerRefused(f"pod {pod.key} holds no Tessera lane{reason}")
    return pod.assignment.lane_id
