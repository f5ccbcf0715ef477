"""A tenant trying to undo its lane from inside its container, as its own process would (issue 39).

Two lanes share one GPU, each with its MPS daemon (the fake control binary on fake GPUs) holding its limits.
The neighbour's container writes a secret into its /dev/shm and binds a unix socket in its MPS pipe directory,
then waits. The prober's container then tries (a) to find any socket in an MPS pipe directory other than its
own lane's daemon's (or, with MPS v3, its namespace's) `control`, and connect to it; (b) to write into its pipe
directory, which must not be the host's or the neighbour's; (c) to read the neighbour's secret from /dev/shm;
(d) to raise its limits through its env, as a client started with that env would; (e) to open a GPU device
node it was not given (after making it with mknod, which the container's capabilities allow: runc's device
rules must still refuse the open). It prints what it saw as one JSON line; the tests (device-plugin and DRA
mode) check each attempt failed, and for (d) ask the lane's daemon, from the host, for the limits it holds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tessera.api import contract

from .node import Node

FAKE_MPS = Path(__file__).parents[2] / "integration" / "agent" / "fake-bin" / "nvidia-cuda-mps-control"
PIPE = f"{contract.MPS_CONTAINER_ROOT}/pipe"
SECRET = "neighbour's secret"

NEIGHBOUR = f"""
import socket, time
open('/dev/shm/secret-b', 'w').write({SECRET!r})
s = socket.socket(socket.AF_UNIX)
s.bind('{PIPE}/neighbour.sock')  # beside its MPS daemon's control socket
s.listen(4)
print('READY', flush=True)
time.sleep(3600)
"""

PROBER = f"""
import errno, json, os, socket, stat, time
out = {{}}
sockets = []
for root, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys')]
    for name in files:
        path = os.path.join(root, name)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                sockets.append(path)
        except OSError:
            pass
out['sockets'] = sorted(sockets)
connected = []
for path in sockets:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    try:
        s.connect(path)
        connected.append(path)
    except OSError:
        pass
    finally:
        s.close()
out['connected'] = connected
open('{PIPE}/probe-a', 'w').write('written by the prober')
# (d) its limits raised in its env, as a client started with that env would have them
raised = dict(os.environ, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='100', CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='0=40960M')
out['raised'] = os.spawnve(os.P_WAIT, '/bin/sh', ['sh', '-c', 'env | grep -c CUDA_MPS_ > /dev/null'], raised)
out['env'] = {{k: v for k, v in os.environ.items() if k.startswith('CUDA_MPS_')}}
out['pipe'] = sorted(os.listdir('{PIPE}'))
try:
    out['shm_read'] = open('/dev/shm/secret-b').read()
except OSError as e:
    out['shm_read'] = errno.errorcode[e.errno]
out['shm'] = sorted(os.listdir('/dev/shm'))
out['dev'] = sorted(n for n in os.listdir('/dev') if n.startswith('nvidia'))

def attempt_open(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return 'opened'
    except OSError as e:
        return errno.errorcode[e.errno]

out['open'] = {{}}
for minor in range({{gpus}}):
    path = '/dev/nvidia%d' % minor
    if not os.path.exists(path):
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(195, minor))
        except OSError as e:
            out['open'][path] = 'mknod ' + errno.errorcode[e.errno]
            continue
    out['open'][path] = attempt_open(path)
print('PROBE ' + json.dumps(out), flush=True)
time.sleep(3600)  # its lane stays while the test asks its daemon what it holds
"""


def prober_script(gpus: int) -> str:
    return PROBER.replace("{gpus}", str(gpus))


def probe_result(log: str) -> dict[str, Any] | None:
    m = re.search(r"^PROBE (.*)$", log, re.M)
    return json.loads(m.group(1)) if m else None


def check_probe(seen: dict[str, Any], own_minor: int, gpus: int) -> list[str]:
    """Every attempt that succeeded, as a list of what went wrong (empty: the lane held)."""
    wrong = []
    own = f"{PIPE}/control"  # its own lane's daemon (legacy) or namespace (v3)
    others = [s for s in seen["sockets"] if s.startswith(contract.MPS_CONTAINER_ROOT) and s != own]
    if others:
        wrong.append(f"(a) found another lane's MPS socket(s) {others} (connected: {seen['connected']})")
    if own not in seen["sockets"]:
        wrong.append(f"(a) its own lane's MPS socket {own} is missing: {seen['sockets']}")
    if "probe-a" not in seen["pipe"] or "neighbour.sock" in seen["pipe"]:
        wrong.append(f"(b) its pipe directory is shared: it holds {seen['pipe']}")
    if seen["shm_read"] == SECRET or "secret-b" in seen["shm"]:
        wrong.append(f"(c) it read the neighbour's /dev/shm: {seen['shm']}, read: {seen['shm_read']!r}")
    expected = sorted([f"nvidia{own_minor}", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"])
    if seen["dev"] != expected:
        wrong.append(f"(e) its device nodes are {seen['dev']}, not {expected}")
    for minor in range(gpus):
        path = f"/dev/nvidia{minor}"
        result = seen["open"].get(path)
        if minor == own_minor and result != "ENXIO":  # allowed by runc, no driver behind the fake node
            wrong.append(f"(e) its own GPU's node {path} gave {result}, not ENXIO (allowed, no driver)")
        if minor != own_minor and result not in ("EPERM", "mknod EPERM"):
            wrong.append(f"(e) another GPU's node {path} gave {result}, not EPERM")
    return wrong


def pod(node: Node, name: str, script: str, extra_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod of the project's image running `script` as root (not privileged); `extra_spec` adds what asks for
    the lane."""
    container: dict[str, Any] = {
        "name": "tenant",
        "image": node.images["TESSERA_IMAGE"],
        "imagePullPolicy": "Never",
        "command": ["python", "-c", script],
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "privileged": False},
    }
    container.update(extra_spec.pop("container", {}))
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    spec.update(extra_spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def held_limits(pipe: Path, generation: str, namespace: str = "") -> dict[str, str]:
    """(d) What the lane's daemon holds, asked from the host through its pipe directory, as an admin would."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}

    def ask(*args: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [str(FAKE_MPS), *args], input=stdin, env=env, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    if generation == "v3":
        return {
            field: ask("namespace", "get", namespace, "tessera", field)
            for field in ("pinned-memory-limit", "active-thread-percentage")
        }
    return {
        "pinned-memory-limit": ask(stdin="get_default_device_pinned_mem_limit 0\n"),
        "active-thread-percentage": ask(stdin="get_default_active_thread_percentage\n"),
    }
