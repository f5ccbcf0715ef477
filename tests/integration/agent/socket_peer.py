"""A separate process that talks to the agent's node sockets, driven line by line over stdin by a test.

Run as `python socket_peer.py`; it waits for `go` on stdin (so the test can give it a cgroup in a fake /proc
tree first), then obeys one command per line and prints one JSON line per answer:

    become <uid>             drop to that uid and gid with no supplementary groups (started as root)
    connect <socket>         open a unix stream connection (peer credentials are taken now)
    send <hex>               send raw bytes on it, print the reply line (or {"eof": true} / {"timeout": true})
    progress <endpoint> <n> <total>   tessera.sdk.report_progress; {"ok": ..., "annotation"|"error": ...}
    lane <socket> <lane> <job>        tessera.sdk.LaneClient: join, one iteration, report progress, leave
    exit
"""

from __future__ import annotations

import json
import socket
import sys


def say(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def main() -> None:
    conn: socket.socket | None = None
    reader = None
    for raw in sys.stdin:
        cmd, _, rest = raw.strip().partition(" ")
        args = rest.split(" ") if rest else []
        try:
            if cmd == "go":
                say({"ready": True})
            elif cmd == "become":
                import os

                os.setgroups([])
                os.setgid(int(args[0]))
                os.setuid(int(args[0]))
                say({"uid": os.getuid()})
            elif cmd == "connect":
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.settimeout(25)  # under the harness's 30 s: a loaded machine answers late, not never
                conn.connect(args[0])
                reader = conn.makefile("rb")
                say({"connected": True})
            elif cmd == "send":
                assert conn is not None and reader is not None
                conn.sendall(bytes.fromhex(args[0]))
                try:
                    line = reader.readline()
                except TimeoutError:
                    say({"timeout": True})
                    continue
                say(json.loads(line) if line else {"eof": True})
            elif cmd == "progress":
                from tessera.sdk import ProgressError, report_progress

                try:
                    say(
                        {
                            "ok": True,
                            "annotation": report_progress(int(args[1]), int(args[2]), endpoint=args[0]),
                        }
                    )
                except ProgressError as err:
                    say({"ok": False, "error": str(err)})
            elif cmd == "lane":
                from tessera.sdk import LaneClient, LaneError

                try:
                    with LaneClient(args[0], lane=args[1], job=args[2], timeout_s=25) as lane:
                        with lane.iteration(last=True):
                            pass
                        lane.report_progress(1, total=2)
                        say({"ok": True, "policy": lane.policy})
                except LaneError as err:
                    say({"ok": False, "error": str(err)})
            elif cmd == "exit":
                return
            else:
                say({"error": f"unknown command {cmd!r}"})
        except OSError as err:
            say({"oserror": err.errno, "error": str(err)})


if __name__ == "__main__":
    main()
