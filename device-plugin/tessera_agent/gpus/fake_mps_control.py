"""A stand-in for NVIDIA's `nvidia-cuda-mps-control`, for nodes and tests without a GPU (the fake GPU edge).

Installed as `tessera-fake-mps-control`; the chart's agent runs it with fake GPUs (`agent.fakeGpus`), so the
agent's enforcement (daemons, pipe directories, namespaces, /dev/shm) runs on a node without GPUs. It enforces
nothing itself: it keeps and answers what it is told, as the real daemon's interface does. Standard library
only, so it also runs as a plain script (tests/integration/agent/fake-bin).

Legacy (v2, the default): `-d` starts a background daemon listening on a unix socket `control` in
$CUDA_MPS_PIPE_DIRECTORY (the real daemon's control pipe lives there too). Without arguments it sends each stdin
line to the daemon and prints the answer, exiting 1 with the real tool's message when no daemon answers. The
daemon keeps the defaults it is told (thread percentage, pinned memory limit per device, client priority) and
answers the matching get_ commands, as the real one does.

MPS v3 (driver r615+), offered only when $FAKE_MPS_PROTOCOLS lists 3 (a legacy driver's binary by default):
`-d -p 3` (or CUDA_MPS_PROTOCOL_VERSION=3, which wins over the flag, as NVIDIA documents) starts a v3 daemon;
`-p 3 -h` lists the v3 modules; `<module> <verb> [args] [--key=value]` sends one v3 command (the CLI grammar of
NVIDIA's "MPS v3 Interface" page: server create/delete/list/get, namespace create/delete/get/set) and `-q`
quits. The daemon keeps the socket tree NVIDIA documents: `<pipe>/control`, `<pipe>/<server>/control`,
`<pipe>/<server>/default/control` and `<pipe>/<server>/<namespace>/control`, one listening socket each.
A namespace socket answers `limits` (standing for what the server tells a client connecting there: its
namespace's limits) and refuses every control verb: NVIDIA does not document whether a namespace socket takes
control commands, and the agent's design does not depend on it (docs/node-agent.md).

Every start and command is appended to $FAKE_MPS_RECORD (default: $CUDA_MPS_PIPE_DIRECTORY/commands.log) as
"<unix time> <line>". At start the daemon writes `daemon.json` beside its socket (its CUDA_VISIBLE_DEVICES, its
pid and protocol) and creates `/dev/shm/fake-mps-<pid>`, standing for the shared memory an MPS server and its
clients exchange work through, so a test can see which /dev/shm it has. A daemon whose control socket is
removed or replaced exits, as no client could reach it any more.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import socket
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
RECORD = os.environ.get("FAKE_MPS_RECORD", os.path.join(PIPE, "commands.log"))
SOCK = os.path.join(PIPE, "control")
V3_OFFERED = "3" in os.environ.get("FAKE_MPS_PROTOCOLS", "2").split(",")
NAME = re.compile(r"[a-z0-9_]{1,64}")
MEMORY = re.compile(r"\d+[KMG]?")
V3_HELP = """Usage: nvidia-cuda-mps-control [OPTIONS] | <module> <verb> [ARGS]
Options: -h --help, -d --daemon, -f --foreground, -m --multiuser, -a --apply <file>, -p --protocol <2|3>,
 -q --quit, -v --version
Modules:
  server        create, delete, list, get, set
  namespace     create, delete, list, get, set
  client        list, get, terminate
  device        list
  sm-partition  create, delete, list
  feature       enable, disable, describe
  memacct       set
  context-share enable, disable
"""
LEGACY_HELP = "Usage: nvidia-cuda-mps-control [-d | -f | -h | -v]\n"
Socket = tuple[str, str | None, str | None]  # (kind, server, namespace) of a listening socket


def record(line: str) -> None:
    with open(RECORD, "a") as f:
        f.write(f"{time.time():.3f} {line}\n")


def listen(path: str) -> socket.socket:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    return s


def still_ours(inode: int) -> bool:
    try:
        return os.stat(SOCK).st_ino == inode
    except OSError:
        return False


def start_daemon(protocol: int) -> str:
    shm = f"/dev/shm/fake-mps-{os.getpid()}"
    with open(os.path.join(PIPE, "daemon.json"), "w") as f:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        json.dump({"pid": os.getpid(), "protocol": protocol, "CUDA_VISIBLE_DEVICES": visible}, f)
    with open(shm, "w") as f:
        f.write("fake MPS server shared memory\n")
    with open(os.path.join(PIPE, "nvidia-cuda-mps-control.pid"), "w") as f:
        f.write(str(os.getpid()))
    return shm


class Legacy:
    """The legacy daemon's defaults and its one control socket."""

    def __init__(self) -> None:
        self.atp = "100.0"
        self.limits: dict[str, str] = {}
        self.priority = "0"

    def answer(self, words: list[str]) -> str:
        verb, args = words[0], words[1:]
        if verb == "set_default_active_thread_percentage":
            self.atp = f"{float(args[0]):.1f}"
        elif verb == "get_default_active_thread_percentage":
            return self.atp
        elif verb == "set_default_device_pinned_mem_limit":
            self.limits[args[0]] = args[1]
        elif verb == "get_default_device_pinned_mem_limit":
            return self.limits.get(args[0], "0")
        elif verb == "set_default_client_priority":
            self.priority = args[0]
        elif verb == "get_default_client_priority":
            return self.priority
        elif verb != "get_server_list":
            return f"unknown command {' '.join(words)}"
        return ""

    def serve(self, shm: str) -> None:
        srv = listen(SOCK)
        srv.settimeout(1.0)
        inode = os.stat(SOCK).st_ino
        while still_ours(inode):
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(5.0)  # one client at a time: one that sends nothing must not hold the daemon
            with conn, contextlib.suppress(OSError):  # a client that hangs up early changes nothing
                cmd = conn.makefile().readline().strip()
                if not cmd:
                    continue
                record(cmd)
                if cmd == "quit":
                    os.unlink(SOCK)
                    conn.sendall(b"\n")
                    break
                conn.sendall((self.answer(cmd.split()) + "\n").encode())
        if os.path.exists(shm):
            os.unlink(shm)


class V3:
    """The v3 daemon's servers and namespaces, and the sockets NVIDIA documents for them."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        # server -> {"allowed": str, "namespaces": {name: {field: value}}}
        self.servers: dict[str, dict[str, object]] = {}
        self.sel.register(listen(SOCK), selectors.EVENT_READ, ("control", None, None))

    def spaces(self, server: str) -> dict[str, dict[str, str]]:
        spaces = self.servers[server]["namespaces"]
        assert isinstance(spaces, dict)
        return spaces

    def close_sockets(self, server: str, namespace: str | None) -> None:
        for key in list(self.sel.get_map().values()):
            kind, srv, ns = key.data
            if kind != "control" and srv == server and namespace in (None, ns):
                self.sel.unregister(key.fileobj)
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                sock.close()

    def command(self, words: list[str]) -> str:
        opts = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
        flags = {w[2:] for w in words if w.startswith("--") and "=" not in w}
        pos = [w for w in words if not w.startswith("--")]
        if len(pos) < 2:
            return "error: expected <module> <verb>"
        module, verb, args = pos[0], pos[1], pos[2:]
        if module == "server":
            return self.server(verb, args, opts, flags)
        if module == "namespace":
            return self.namespace(verb, args, opts, flags)
        return f"error: unknown module {module}"

    def server(self, verb: str, args: list[str], opts: dict[str, str], flags: set[str]) -> str:
        name = args[0] if args else ""
        if verb == "create":
            if not NAME.fullmatch(name) or name in self.servers:
                return f"error: cannot create server {name!r}"
            self.servers[name] = {"allowed": opts.get("allowed-devices", ""), "namespaces": {}}
            server_socket = listen(os.path.join(PIPE, name, "control"))
            self.sel.register(server_socket, selectors.EVENT_READ, ("ns", name, "default"))
            self.add_namespace(name, "default")
            return ""
        if name not in self.servers:
            return f"error: no server {name}"
        allowed = str(self.servers[name]["allowed"])
        if verb == "delete":
            if any(ns["clients"] != "0" for ns in self.spaces(name).values()) and "force" not in flags:
                return f"error: server {name} has active clients"
            self.close_sockets(name, None)
            shutil.rmtree(os.path.join(PIPE, name), ignore_errors=True)
            del self.servers[name]
            return ""
        directory = os.path.join(PIPE, name)
        values = {"name": name, "status": "Ready", "allowed-devices": allowed, "pipe-directory": directory}
        values |= {"pid": str(os.getpid()), "uid": str(os.getuid())}
        if verb == "get":
            field = args[1] if len(args) > 1 else ""
            return values.get(field, f"error: unknown field {field}")
        if verb == "list":
            return f"{name},{os.getuid()},{os.getpid()},Ready,{directory},{allowed or '-'},-"
        return f"error: unknown verb server {verb}"

    def add_namespace(self, server: str, name: str) -> None:
        self.spaces(server)[name] = {
            "pinned-memory-limit": "-",
            "active-thread-percentage": "-",
            "client-priority": "-",
            "clients": "0",
        }
        path = os.path.join(PIPE, server, name, "control")
        self.sel.register(listen(path), selectors.EVENT_READ, ("ns", server, name))

    def namespace(self, verb: str, args: list[str], opts: dict[str, str], flags: set[str]) -> str:
        name = args[0] if args else ""
        server = opts.get("server", "") if verb != "get" else (args[1] if len(args) > 1 else "")
        if server not in self.servers:
            return f"error: no server {server}"
        spaces = self.spaces(server)
        if verb == "create":
            if not NAME.fullmatch(name) or name in spaces:
                return f"error: cannot create namespace {name!r}"
            self.add_namespace(server, name)
            return ""
        if name not in spaces:
            return f"error: no namespace {name} in server {server}"
        ns = spaces[name]
        if verb == "set":
            for key, value in opts.items():
                if key != "server" and not valid(key, value):
                    return f"error: invalid {key}={value}"
            ns |= {k: v for k, v in opts.items() if k != "server"}
            return ""
        if verb == "get":
            field = args[2] if len(args) > 2 else ""
            return ns.get(field, f"error: unknown field {field}")
        if verb == "delete":
            if name == "default":
                return "error: the default namespace cannot be deleted"
            if ns["clients"] != "0" and "force" not in flags:
                return f"error: namespace {name} has active clients"
            self.close_sockets(server, name)
            shutil.rmtree(os.path.join(PIPE, server, name), ignore_errors=True)
            del spaces[name]
            return ""
        return f"error: unknown verb namespace {verb}"

    def serve(self, shm: str) -> None:
        inode = os.stat(SOCK).st_ino
        while still_ours(inode):
            for key, _ in self.sel.select(timeout=1.0):
                listener = key.fileobj
                assert isinstance(listener, socket.socket)
                conn, _ = listener.accept()
                conn.settimeout(5.0)  # one client at a time: one that sends nothing must not hold the daemon
                with conn:
                    try:
                        if not self.handle(conn, key.data):
                            return self.quit(shm)
                    except OSError:  # a client that hangs up early changes nothing
                        continue
        if os.path.exists(shm):
            os.unlink(shm)

    def handle(self, conn: socket.socket, data: Socket) -> bool:
        """Answer one connection; False when it asked the daemon to quit."""
        line = conn.makefile().readline().strip()
        kind, server, ns = data
        if kind == "ns":
            # A client of the namespace: it is told its limits; nothing here reconfigures anything.
            record(f"[{server}/{ns}] {line}")
            assert server is not None and ns is not None
            if line == "limits":
                space = self.spaces(server)[ns]
                reply = json.dumps({k: v for k, v in space.items() if k != "clients"})
            else:
                reply = "error: not a control socket"
            conn.sendall((reply + "\n").encode())
            return True
        record(line)
        if line in ("quit", "-q"):
            conn.sendall(b"\n")
            return False
        conn.sendall((self.command(line.split()) + "\n").encode())
        return True

    def quit(self, shm: str) -> None:
        for key in list(self.sel.get_map().values()):  # the sockets go, the directories stay
            if key.data[0] == "ns":
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                os.unlink(sock.getsockname())
        os.unlink(SOCK)
        if os.path.exists(shm):
            os.unlink(shm)


def valid(key: str, value: str) -> bool:
    """A namespace setting as v3 takes it: memory with a K/M/G suffix, a percentage 1-100, a priority 0 or 1."""
    if key == "pinned-memory-limit":
        return MEMORY.fullmatch(value) is not None
    if key == "active-thread-percentage":
        return value.isdigit() and 1 <= int(value) <= 100
    return key == "client-priority" and value in ("0", "1")


def daemonize(protocol: int) -> int:
    os.makedirs(PIPE, exist_ok=True)
    if os.path.exists(SOCK):  # left by a crashed daemon
        os.unlink(SOCK)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            shm = start_daemon(protocol)
            if protocol == 3:
                V3().serve(shm)
            else:
                Legacy().serve(shm)
        os._exit(0)
    # wait until the control socket answers, as the real -d returns once the daemon is up
    for _ in range(500):
        if os.path.exists(SOCK):
            return 0
        time.sleep(0.01)
    print("daemon did not start", file=sys.stderr)
    return 1


def send(line: str) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCK)
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with s:
        s.sendall((line + "\n").encode())
        answer = s.makefile().readline().rstrip("\n")
    if answer.startswith("error:"):
        print(answer, file=sys.stderr)
        return 1
    if answer:
        print(answer)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    protocol = 2
    for flag in ("-p", "--protocol"):
        if flag in args:
            i = args.index(flag)
            if not V3_OFFERED:
                print(f"Unrecognized option {flag}", file=sys.stderr)
                return 1
            protocol = int(args[i + 1])
            args = args[:i] + args[i + 2 :]
    if os.environ.get("CUDA_MPS_PROTOCOL_VERSION") and V3_OFFERED:
        protocol = int(os.environ["CUDA_MPS_PROTOCOL_VERSION"])
    if args in (["-h"], ["--help"]):
        print(V3_HELP if protocol == 3 else LEGACY_HELP, end="")
        return 0
    if args in (["-d"], ["--daemon"]):
        record("-d" if protocol == 2 else "-d -p 3")
        return daemonize(protocol)
    if args in (["-q"], ["--quit"]):
        return send("-q")
    if args:
        return send(" ".join(args))
    for line in sys.stdin:
        if line.strip() and send(line.strip()) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
