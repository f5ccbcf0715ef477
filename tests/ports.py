"""A free TCP port on loopback for a process a test starts.

Ports come from below the kernel's ephemeral range (`ip_local_port_range`): the kernel gives ports from that
range to every outgoing connection and to every `bind(0)`, so a port picked there with `bind(0)` and
released can be taken again before the process the test starts binds it ("address already in use", seen
in full runs). Below the range only another explicit choice can collide, and the choice is random.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # clear of well-known and commonly configured ports
_rng = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on now, outside the ephemeral range when there is room below it."""
    top = _ephemeral_start()
    if top - _LOWEST > 1_000:
        for _ in range(200):
            port = _rng.randrange(_LOWEST, top)
            if _bindable(port):
                return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
