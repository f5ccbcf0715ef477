"""Lanes enforced through MPS v3 namespaces (issue 39), and GPU compute modes that follow the daemons.

The fake control binary offers v3 only when FAKE_MPS_PROTOCOLS lists 3 (a driver r615+), keeps the socket tree
NVIDIA documents (`<pipe>/<server>/<namespace>/control`) and records every command. The commands the agent
sends are checked against the v3 syntax of NVIDIA's "MPS v3 Interface" page, not against the agent's code.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tessera_agent.config import AgentConfig
from tessera_agent.enforce import mps_v3
from tessera_agent.enforce.compute_mode import ComputeModes
from tessera_agent.enforce.lane_daemons import LaneDaemons
from tessera_agent.enforce.lane_dirs import LaneDirs
from tessera_agent.gpus.fake_backend import FakeGpuBackend
from tessera_agent.kubelet.plugin import DevicePluginServicer
from tessera_agent.pods import StaticPodSource, pod_info_from_manifest

from .test_agent_lane_enforcement import (
    FAKE_MPS,
    UUIDS,
    AbortContext,
    alive,
    lane_pod,
    request,
    until,
)

# NVIDIA's v3 grammar: `<module> <verb> [positional] [--key=value]`; names lowercase letters, digits and `_`
# up to 64 characters; memory with a K/M/G suffix; a percentage 1-100; a client priority 0 or 1.
_NAME = r"[a-z0-9_]{1,64}"
DOCUMENTED_V3 = [
    re.compile(r"-d -p 3"),
    re.compile(rf"server create {_NAME} --allowed-devices=GPU-[0-9a-f-]+(,GPU-[0-9a-f-]+)*"),
    re.compile(rf"server get {_NAME} status"),
    re.compile(rf"namespace create {_NAME} --server={_NAME}"),
    re.compile(
        rf"namespace set {_NAME} --server={_NAME} --pinned-memory-limit=\d+[KMG] "
        r"--active-thread-percentage=(100|[1-9][0-9]?) --client-priority=[01]"
    ),
    re.compile(rf"namespace delete {_NAME} --server={_NAME}( --force)?"),
    re.compile(
        rf"namespace get {_NAME} {_NAME} (pinned-memory-limit|active-thread-percentage|client-priority)"
    ),
    re.compile(r"-q"),
]


@pytest.fixture
def v3_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_PROTOCOLS", "2,3")


def recorded(pipe: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in (pipe / "commands.log").read_text().splitlines()]


def v3_cli(pipe: Path, *args: str) -> str:
    """What the daemon answers, asked as an admin would: the control binary on the daemon's pipe directory."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    out = subprocess.run([FAKE_MPS, *args], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def as_client(directory: Path, line: str) -> str:
    """Connect to the socket a lane's container finds in its CUDA_MPS_PIPE_DIRECTORY, as its process would."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(directory / "control"))
        s.sendall((line + "\n").encode())
        return s.makefile().readline().strip()


def servicer(
    root: Path, pods: list[dict[str, Any]], *, sharing: str = "lane", backend: FakeGpuBackend | None = None
) -> tuple[DevicePluginServicer, StaticPodSource, FakeGpuBackend]:
    cfg = AgentConfig(node_name="n1", mps_root=root / "mps", mps_protocol="v3", mps_server_sharing=sharing)  # type: ignore[arg-type]
    source = StaticPodSource([pod_info_from_manifest(m) for m in pods])
    gpus = backend or FakeGpuBackend.uniform(2)
    daemons = LaneDaemons(
        LaneDirs(cfg.mps_root),
        binary=FAKE_MPS,
        check_interval_s=0.2,
        layout=cfg.lane_layout(),
        compute_modes=ComputeModes(gpus, cfg.mps_root / "compute-modes.json"),
    )
    return DevicePluginServicer(cfg, gpus, source, daemons=daemons), source, gpus


def test_the_generation_is_what_the_control_binary_offers(
    monkeypatch: pytest.MonkeyPatch, plugin_dir: Path
) -> None:
    assert mps_v3.detect(FAKE_MPS) == "legacy"  # a driver before r615: `-p 3` is not an option
    monkeypatch.setenv("FAKE_MPS_PROTOCOLS", "2,3")
    assert mps_v3.detect(FAKE_MPS) == "v3"
    assert mps_v3.detect(str(plugin_dir / "missing")) == "legacy"


async def test_a_v3_lane_is_a_namespace_with_its_limits_and_its_container_gets_only_its_socket(
    v3_driver: None, plugin_dir: Path
) -> None:
    plugin, _, gpus = servicer(plugin_dir, [lane_pod("a", 1, 4096, 30)])
    try:
        resp = await plugin.Allocate(request(f"{UUIDS[1]}::0"), AbortContext())
        (c,) = resp.container_responses
        daemon_pipe = plugin_dir / "mps" / "lanes" / "uid-a" / "pipe"
        ns = mps_v3.namespace_name("uid-a")
        mounts = {m.container_path: Path(m.host_path) for m in c.mounts}
        # The container's pipe directory is its namespace's, inside the daemon's: the daemon's own control
        # socket (the one that takes control commands) is not in it.
        assert mounts["/mps/pipe"] == daemon_pipe / "tessera" / ns
        assert sorted(p.name for p in mounts["/mps/pipe"].iterdir()) == ["control"]
        assert (daemon_pipe / "control").exists()
        assert mounts["/dev/shm"] == plugin_dir / "mps" / "lanes" / "uid-a" / "shm"

        sent = recorded(daemon_pipe)
        assert sent == [
            "-d -p 3",
            f"server create tessera --allowed-devices={UUIDS[1]}",
            f"namespace create {ns} --server=tessera",
            f"namespace set {ns} --server=tessera --pinned-memory-limit=4096M "
            "--active-thread-percentage=30 --client-priority=0",
        ]
        assert all(any(p.fullmatch(cmd) for p in DOCUMENTED_V3) for cmd in sent), sent
        daemon = json.loads((daemon_pipe / "daemon.json").read_text())
        assert (daemon["protocol"], daemon["CUDA_VISIBLE_DEVICES"]) == (3, UUIDS[1])

        # A client in the namespace is given its limits; the env it was given can only tighten memory.
        assert json.loads(as_client(mounts["/mps/pipe"], "limits")) == {
            "pinned-memory-limit": "4096M",
            "active-thread-percentage": "30",
            "client-priority": "0",
        }
        env = dict(c.envs)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/pipe"
        # A tenant raising its env changes nothing the daemon holds for its namespace.
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "100", "0=40960M"
        assert v3_cli(daemon_pipe, "namespace", "get", ns, "tessera", "active-thread-percentage") == "30"
        assert v3_cli(daemon_pipe, "namespace", "get", ns, "tessera", "pinned-memory-limit") == "4096M"
        # One daemon serves the GPU: EXCLUSIVE_PROCESS, so no process can use it past MPS.
        assert [gpus.compute_mode(u) for u in UUIDS] == ["Default", "ExclusiveProcess"]
    finally:
        await plugin.daemons.close()


async def test_lanes_on_one_gpu_share_a_v3_server_when_asked_and_compute_modes_follow(
    v3_driver: None, plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = plugin_dir / "record.log"
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))  # outlives the servers' directories

    def told() -> list[str]:  # what the daemons were told, without their health checks
        lines = [line.split(" ", 1)[1] for line in record.read_text().splitlines()]
        return [line for line in lines if line != "server get tessera status"]

    pods = [lane_pod("a", 0, 4096, 30), lane_pod("b", 0, 8192, 50), lane_pod("c", 1, 1024, 10)]
    plugin, source, gpus = servicer(plugin_dir, pods[:1], sharing="gpu")
    servers = plugin_dir / "mps" / "servers"
    try:
        gpus.set_compute_mode(UUIDS[1], "Prohibited")  # what the admin had set
        await plugin.Allocate(request(f"{UUIDS[0]}::0"), AbortContext())
        source.pods.append(pod_info_from_manifest(pods[1]))  # bound after a: one pod at a time
        await plugin.Allocate(request(f"{UUIDS[0]}::1"), AbortContext())
        (server,) = servers.iterdir()
        pipe = server / "pipe"
        a, b = mps_v3.namespace_name("uid-a"), mps_v3.namespace_name("uid-b")
        # One daemon and server for the GPU, each lane a namespace in it with its own limits.
        assert [c for c in told() if c.startswith(("-d", "server create"))] == [
            "-d -p 3",
            f"server create tessera --allowed-devices={UUIDS[0]}",
        ]
        assert v3_cli(pipe, "namespace", "get", a, "tessera", "pinned-memory-limit") == "4096M"
        assert v3_cli(pipe, "namespace", "get", b, "tessera", "active-thread-percentage") == "50"
        assert gpus.compute_mode(UUIDS[0]) == "ExclusiveProcess"
        source.pods.append(pod_info_from_manifest(pods[2]))
        await plugin.Allocate(request(f"{UUIDS[1]}::0"), AbortContext())
        assert gpus.compute_mode(UUIDS[1]) == "ExclusiveProcess"
        assert len(list(servers.iterdir())) == 2  # GPU 1's own server

        # a goes: its namespace is deleted, b's is untouched and its server keeps running.
        await plugin.daemons.release("uid-a")
        assert told()[-1] == f"namespace delete {a} --server=tessera --force"
        assert not (pipe / "tessera" / a).exists() and (pipe / "tessera" / b / "control").exists()
        assert v3_cli(pipe, "namespace", "get", b, "tessera", "pinned-memory-limit") == "8192M"
        # The last lanes go: the daemons quit, their directories go, the admin's modes come back.
        await plugin.daemons.release("uid-b")
        assert told()[-1] == "-q" and not server.exists()
        await plugin.daemons.release("uid-c")
        assert told()[-1] == "-q" and not any(servers.iterdir())
        assert [gpus.compute_mode(u) for u in UUIDS] == ["Default", "Prohibited"]
        everything = [line.split(" ", 1)[1] for line in record.read_text().splitlines()]
        assert all(any(p.fullmatch(cmd) for p in DOCUMENTED_V3) for cmd in everything), everything
    finally:
        await plugin.daemons.close()


async def test_two_daemons_on_a_gpu_set_it_to_default_and_an_agent_restart_keeps_the_admins_mode(
    v3_driver: None, plugin_dir: Path
) -> None:
    pods = [lane_pod("a", 0, 4096, 30), lane_pod("b", 0, 8192, 50)]
    backend = FakeGpuBackend.uniform(2)
    backend.set_compute_mode(UUIDS[0], "Prohibited")
    plugin, source, gpus = servicer(plugin_dir, pods[:1], backend=backend)
    await plugin.Allocate(request(f"{UUIDS[0]}::0"), AbortContext())
    assert gpus.compute_mode(UUIDS[0]) == "ExclusiveProcess"
    source.pods.append(pod_info_from_manifest(pods[1]))
    await plugin.Allocate(request(f"{UUIDS[0]}::1"), AbortContext())
    # Two servers (a daemon per lane) need a context each: the GPU cannot be exclusive to one.
    assert gpus.compute_mode(UUIDS[0]) == "Default"
    await plugin.daemons.close()  # the agent stops: no server left, the admin's mode comes back
    assert gpus.compute_mode(UUIDS[0]) == "Prohibited"

    # A restarted agent takes up both lanes again; the mode it restores at the end is the admin's.
    again, _, _ = servicer(plugin_dir, [], backend=backend)
    try:
        await again.keep_lanes(await source.pods_on_node("n1"), again.daemons.clock())
        assert again.daemons.running("uid-a") is not None and again.daemons.running("uid-b") is not None
        await again.daemons.release("uid-a")
        assert gpus.compute_mode(UUIDS[0]) == "ExclusiveProcess"
        await again.daemons.release("uid-b")
        assert gpus.compute_mode(UUIDS[0]) == "Prohibited"
    finally:
        await again.daemons.close()


def test_an_agent_killed_with_gpus_exclusive_restores_the_admins_mode_when_it_comes_back(
    plugin_dir: Path,
) -> None:
    backend = FakeGpuBackend.uniform(1)
    backend.set_compute_mode(UUIDS[0], "Prohibited")
    state = plugin_dir / "compute-modes.json"
    ComputeModes(backend, state).follow({UUIDS[0]: 1})
    assert backend.compute_mode(UUIDS[0]) == "ExclusiveProcess"
    # Killed: nothing restored. The next agent reads what the admin had, not its predecessor's setting.
    again = ComputeModes(backend, state)
    again.follow({UUIDS[0]: 1})
    again.follow({})
    assert backend.compute_mode(UUIDS[0]) == "Prohibited" and json.loads(state.read_text()) == {}


async def test_a_v3_daemon_that_dies_is_restarted_with_its_server_and_namespaces(
    v3_driver: None, plugin_dir: Path
) -> None:
    plugin, _, _ = servicer(plugin_dir, [lane_pod("a", 0, 2048, 40)])
    try:
        await plugin.Allocate(request(f"{UUIDS[0]}::0"), AbortContext())
        pipe = plugin_dir / "mps" / "lanes" / "uid-a" / "pipe"
        ns = mps_v3.namespace_name("uid-a")
        first = json.loads((pipe / "daemon.json").read_text())["pid"]
        os.kill(first, 9)
        await until(lambda: not alive(first), "the daemon exiting")
        await until(
            lambda: json.loads((pipe / "daemon.json").read_text())["pid"] != first, "a new daemon", 60
        )
        await until(
            lambda: (
                (pipe / "tessera" / ns / "control").exists()
                and recorded(pipe)[-1].startswith(f"namespace set {ns}")
            ),
            "the namespace set up again",
            60,
        )
        assert v3_cli(pipe, "namespace", "get", ns, "tessera", "pinned-memory-limit") == "2048M"
    finally:
        await plugin.daemons.close()


async def agent_refusal(plugin_dir: Path, *flags: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera_agent.cli",
        *("--node", "n1", "--fake-gpus", "1", "--device-plugin-dir", str(plugin_dir)),
        *("--mps-binary", FAKE_MPS, "--metrics-port", "0", "--mps-root", str(plugin_dir / "mps"), *flags),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode().strip()


async def test_the_agent_refuses_v3_options_the_node_or_the_other_flags_cannot_honour(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_MPS_PROTOCOLS", raising=False)  # a driver before r615
    code, err = await agent_refusal(plugin_dir, "--mps-protocol", "v3")
    assert code == 1 and "offers no MPS v3 namespaces" in err and "Traceback" not in err, err
    code, err = await agent_refusal(plugin_dir, "--mps-server-sharing", "gpu")
    assert code == 1 and "--mps-server-sharing gpu needs MPS v3 namespaces" in err, err
    code, err = await agent_refusal(plugin_dir, "--mps-protocol", "legacy", "--mps-server-sharing", "gpu")
    assert code == 2 and err.startswith("tessera-agent: --mps-server-sharing (agent.mps_server_sharing): "), (
        err
    )
    code, err = await agent_refusal(plugin_dir, "--no-mps", "--mps-protocol", "v3")
    assert code == 2 and "MPS v3 namespaces need MPS" in err, err
    monkeypatch.setenv("FAKE_MPS_PROTOCOLS", "2,3")
    long_root = plugin_dir / ("x" * 40)
    code, err = await agent_refusal(plugin_dir, "--mps-root", str(long_root))
    assert code == 1 and "over the kernel's limit of 107" in err, err


def test_the_enforcing_mechanism_names_v3_namespaces_and_exclusive_process() -> None:
    from tessera_agent.enforce.lane_dirs import LaneLayout
    from tessera_agent.enforce.mechanism import mechanisms

    root = Path("/run/tessera/mps")
    assert mechanisms(True, LaneLayout(root, "v3"), exclusive_process=True) == {
        "memory": "mps-namespace",
        "compute": "mps-namespace",
        "isolation": "lane-directories",
        "devices": "device-nodes+exclusive-process",
    }
    assert mechanisms(True, LaneLayout(root, "v3", "gpu"))["isolation"] == "namespace-directories"
    assert mechanisms(True, LaneLayout(root))["memory"] == "mps-daemon-per-lane"
    with pytest.raises(ValueError, match="need MPS v3"):
        LaneLayout(root, "legacy", "gpu")


async def test_a_claims_lane_is_a_v3_namespace_and_its_cdi_spec_mounts_only_that(
    v3_driver: None, plugin_dir: Path
) -> None:
    from tessera_agent.kubelet.dra_lanes import cdi_spec_path
    from tessera_agent.kubelet.dra_plugin import DraServicer

    from .test_agent_dra import NODE, FakeDraApi, claim, result

    cfg = AgentConfig(
        node_name=NODE,
        mps_root=plugin_dir / "mps",
        kubelet_plugins_dir=plugin_dir / "plugins",
        kubelet_registry_dir=plugin_dir / "plugins_registry",
        cdi_dir=plugin_dir / "cdi",
        lanes_api="dra",
        mps_protocol="v3",
    )
    backend = FakeGpuBackend.uniform(2)
    api = FakeDraApi()
    daemons = LaneDaemons(
        LaneDirs(cfg.mps_root),
        binary=FAKE_MPS,
        layout=cfg.lane_layout(),
        compute_modes=ComputeModes(backend, cfg.mps_root / "compute-modes.json"),
    )
    s = DraServicer(cfg, backend, api, daemons)
    try:
        api.claims[("ml", "train")] = claim("train", "uid-t", [result("gpu-1", "10Gi", "30")], pod="train")
        await s.prepare("ml", "train", "uid-t")
        spec = json.loads(cdi_spec_path(cfg.cdi_dir, "uid-t").read_text())
        mounts = {
            m["containerPath"]: Path(m["hostPath"]) for m in spec["devices"][0]["containerEdits"]["mounts"]
        }
        pipe = plugin_dir / "mps" / "lanes" / "uid-t" / "pipe"
        ns = mps_v3.namespace_name("uid-t")
        assert mounts["/mps/pipe"] == pipe / "tessera" / ns
        assert sorted(p.name for p in mounts["/mps/pipe"].iterdir()) == ["control"]
        assert recorded(pipe)[1:4] == [
            f"server create tessera --allowed-devices={UUIDS[1]}",
            f"namespace create {ns} --server=tessera",
            f"namespace set {ns} --server=tessera --pinned-memory-limit=10240M "
            "--active-thread-percentage=30 --client-priority=0",
        ]
        assert backend.compute_mode(UUIDS[1]) == "ExclusiveProcess"
        await s.unprepare("uid-t")
        assert not pipe.exists() and backend.compute_mode(UUIDS[1]) == "Default"
    finally:
        await daemons.close()
