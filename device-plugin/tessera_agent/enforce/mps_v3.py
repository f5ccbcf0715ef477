"""MPS v3 (driver r615+, CUDA 13.4): which generation the node's driver offers, and the v3 commands a lane needs.

A v3 control daemon runs named servers, each with namespaces; a client lands in the namespace whose socket
directory it is given (`<pipe>/<server>/<namespace>`), and the namespace's pinned memory limit, active thread
percentage and client priority apply to it (a client's env can only tighten the memory limit; the namespace's
thread percentage overrides the client's). The commands follow NVIDIA's "MPS v3 Interface" page
(docs/mps-v3.md): `server create <name> --allowed-devices=<UUIDs>`, `namespace create <name> --server=<s>`,
`namespace set <name> --server=<s> --pinned-memory-limit=<v> --active-thread-percentage=<p>
--client-priority=<p>`, `namespace delete <name> --server=<s> --force`, `server get <name> status`.

Every namespace gets all three limits: NVIDIA's guide measured that server-level limits reach only a server's
default namespace, and a named namespace left without them gets the whole GPU.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
from collections.abc import Sequence
from typing import Literal

log = logging.getLogger(__name__)

SERVER = "tessera"  # the one server each of the agent's v3 daemons runs
Generation = Literal["legacy", "v3"]


def namespace_name(lane: str) -> str:
    """The v3 namespace of a lane (a pod or claim UID): `lane_` and 16 hex digits of the key's digest. v3 names
    allow lowercase letters, digits and `_` up to 64 characters; the digest also keeps the socket path
    `<mps root>/lanes/<uid>/pipe/tessera/<namespace>/control` under the kernel's 108 bytes."""
    return "lane_" + hashlib.sha256(lane.encode()).hexdigest()[:16]


def socket_path_bytes(mps_root: str) -> int:
    """The longest socket path a v3 lane's daemon makes under `mps_root`, for a 36-character UID."""
    return len(f"{mps_root}/lanes/{'x' * 36}/pipe/{SERVER}/{namespace_name('x')}/control".encode())


def create_server(gpus: Sequence[str]) -> list[str]:
    return ["server", "create", SERVER, f"--allowed-devices={','.join(gpus)}"]


def server_status() -> list[str]:
    return ["server", "get", SERVER, "status"]


def create_namespace(lane: str) -> list[str]:
    return ["namespace", "create", namespace_name(lane), f"--server={SERVER}"]


def set_namespace(lane: str, memory_mib: int, thread_percent: int, client_priority: int) -> list[str]:
    if memory_mib <= 0:
        raise ValueError(f"pinned memory limit must be positive, got {memory_mib} MiB")
    if not 1 <= thread_percent <= 100:
        raise ValueError(f"active thread percentage must be 1..100, got {thread_percent}")
    if client_priority not in (0, 1):
        raise ValueError(f"client priority must be 0 or 1, got {client_priority}")
    return [
        "namespace",
        "set",
        namespace_name(lane),
        f"--server={SERVER}",
        f"--pinned-memory-limit={memory_mib}M",
        f"--active-thread-percentage={thread_percent}",
        f"--client-priority={client_priority}",
    ]


def delete_namespace(lane: str) -> list[str]:
    # --force: the lane's pod or claim is gone; a client left behind must not keep its namespace alive
    return ["namespace", "delete", namespace_name(lane), f"--server={SERVER}", "--force"]


def detect(binary: str, timeout_s: float = 10.0) -> Generation:
    """v3 when `<binary> -p 3 -h` lists the `server` and `namespace` modules (NVIDIA's documented capability
    check), else legacy. A binary that cannot be run counts as legacy; starting it fails later with the reason."""
    try:
        out = subprocess.run(
            [binary, "-p", "3", "-h"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        log.info("MPS generation check (%s -p 3 -h) failed: %s; taking legacy", binary, err)
        return "legacy"
    text = out.stdout + out.stderr
    words = {line.split()[0] for line in text.splitlines() if line.split()}
    return "v3" if out.returncode == 0 and {"server", "namespace"} <= words else "legacy"
