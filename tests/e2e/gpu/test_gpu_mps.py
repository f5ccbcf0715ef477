"""On a real NVIDIA GPU: NVML discovery, MPS start, and per-client pinned memory limits (issue 7, third item).

Skips with a reason where there is no driver, GPU or MPS control binary. Run on a GPU machine with
`.venv/bin/pytest -m gpu tests/e2e/gpu -s` (as root, so the MPS daemon can start).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _skip_reason() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as err:
        return f"no usable NVML here ({err})"
    if count == 0:
        return "NVML sees no GPU"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        return f"libcuda.so.1 not loadable ({err})"
    if shutil.which("nvidia-cuda-mps-control") is None:
        return "nvidia-cuda-mps-control is not on PATH"
    return None


REASON = _skip_reason()
if REASON:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason=f"needs a real NVIDIA GPU: {REASON}")]

CLIENT = str(Path(__file__).parent / "cuda_client.py")


def test_nvml_discovers_gpus_and_inventory() -> None:
    from tessera_agent.gpus.inventory import gpu_inventory
    from tessera_agent.gpus.nvml_backend import NvmlGpuBackend

    backend = NvmlGpuBackend()
    try:
        gpus = backend.gpus()
        inv = gpu_inventory(backend)
        print(
            "NVML:",
            [
                (g.index, g.uuid, g.model, g.memory_total_bytes >> 20, g.memory_reserved_bytes >> 20)
                for g in gpus
            ],
            "PCI:",
            [(g.index, g.pci_bus_id, g.pcie_root, g.numa_node) for g in gpus],
        )
        assert gpus and all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
        # a physical GPU has a PCI address and sits under a host bridge in sysfs (the slice's pcieRoot)
        assert all(g.pci_bus_id and g.pcie_root and g.pcie_root.startswith("pci") for g in gpus), gpus
        assert all(0 < i["memoryMiB"] <= g.memory_total_bytes >> 20 for i, g in zip(inv, gpus, strict=True))
        usage = backend.usage(gpus[0].uuid)
        assert 0 <= usage.utilization_percent <= 100
        backend.processes(gpus[0].uuid)  # must not raise on this driver
    finally:
        backend.close()


def run_client(env: dict[str, str], mib: int) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, CLIENT, str(mib)], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_mps_clients_are_held_to_their_pinned_memory_limits() -> None:
    from tessera_agent.enforce.mps import MpsManager, MpsPhase

    root = Path(tempfile.mkdtemp(prefix="tessera-mps-"))
    mgr = MpsManager(root / "pipe", root / "log")

    async def scenario() -> tuple[dict[str, object], dict[str, object]]:
        await mgr.start()
        assert mgr.state().phase is MpsPhase.RUNNING
        base = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
        }
        small = await asyncio.to_thread(
            run_client, {**base, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}, 2048
        )
        large = await asyncio.to_thread(
            run_client, {**base, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}, 2048
        )
        print("server list:", await mgr.command("get_server_list"))
        await mgr.stop()
        return small, large

    try:
        small, large = asyncio.run(scenario())
    finally:
        subprocess.run(
            ["nvidia-cuda-mps-control"],
            input="quit\n",
            text=True,
            capture_output=True,
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe")},
        )
    print("client limited to 1 GiB asking 2 GiB:", small)
    print("client limited to 4 GiB asking 2 GiB:", large)
    assert small.get("alloc_result") == 2  # CUDA_ERROR_OUT_OF_MEMORY at its limit
    assert large.get("alloc_result") == 0


def test_two_lanes_daemons_hold_each_lane_to_its_memory_whatever_its_env_says() -> None:
    """Issue 39 on a GPU: two lanes of one GPU, each with its own daemon and limits set server-side (1 GiB and
    4 GiB). The 1 GiB lane's client raises its env limit to 8 GiB and still gets out of memory at 2 GiB, in a
    /dev/shm of its own (the lane's), while the neighbouring lane allocates its 2 GiB."""
    from tessera_agent.enforce.lane_daemons import LaneDaemons, LaneLimits
    from tessera_agent.enforce.lane_dirs import LaneDirs
    from tessera_agent.gpus.nvml_backend import NvmlGpuBackend

    backend = NvmlGpuBackend()
    gpu = backend.gpus()[0].uuid
    backend.close()
    root = Path(tempfile.mkdtemp(prefix="tessera-lanes-"))
    daemons = LaneDaemons(LaneDirs(root))

    async def client_in_lane(key: str, env: dict[str, str], mib: int) -> dict[str, object]:
        pipe = daemons.dirs.paths(key).pipe
        shm = daemons.dirs.paths(key).shm
        # The client shares the lane's /dev/shm with its server, as the lane's container would.
        script = 'mount --bind "$0" /dev/shm && exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, str(shm)]
        argv += [sys.executable, CLIENT, str(mib)]
        full = {**os.environ, **env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": gpu}
        r = await asyncio.to_thread(
            subprocess.run, argv, env=full, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))

    async def scenario() -> tuple[dict[str, object], dict[str, object]]:
        try:
            await daemons.ensure("small", LaneLimits((gpu,), (1024,), 50))
            await daemons.ensure("large", LaneLimits((gpu,), (4096,), 50))
            small = await client_in_lane("small", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}, 2048)
            large = await client_in_lane("large", {}, 2048)
            return small, large
        finally:
            await daemons.close()

    small, large = asyncio.run(scenario())
    print("lane held to 1 GiB by its daemon, env raised to 8 GiB, asking 2 GiB:", small)
    print("neighbouring lane held to 4 GiB, asking 2 GiB:", large)
    assert small.get("alloc_result") == 2  # CUDA_ERROR_OUT_OF_MEMORY: the daemon's limit, not the env's
    assert large.get("alloc_result") == 0


def client_in(
    pipe: Path, shm: Path, gpu: str, args: list[str], env: dict[str, str] | None = None
) -> dict[str, object]:
    """A CUDA client as a lane's container runs it: its pipe directory and /dev/shm those of its lane."""
    script = 'mount --bind "$0" /dev/shm && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, str(shm)]
    argv += [sys.executable, CLIENT, *args]
    full = {**os.environ, **(env or {}), "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": gpu}
    r = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_v3_namespaces_hold_lanes_to_their_memory_and_threads_and_a_client_cannot_raise_them() -> None:
    """Issue 39 on a GPU with MPS v3 (driver r615+): two lanes as namespaces of one shared server (1 GiB / 25 %
    and 4 GiB / 100 %). The small lane's client, its env raised, gets out of memory at 2 GiB while its neighbour
    allocates 2 GiB; its kernels run on at most about a quarter of the SMs; and a control command sent from its
    namespace directory leaves the namespace's limit as the agent set it."""
    from tessera_agent.enforce import mps_v3
    from tessera_agent.enforce.compute_mode import ComputeModes
    from tessera_agent.enforce.lane_daemons import LaneDaemons, LaneLimits
    from tessera_agent.enforce.lane_dirs import LaneDirs, LaneLayout
    from tessera_agent.gpus.nvml_backend import NvmlGpuBackend

    if mps_v3.detect("nvidia-cuda-mps-control") != "v3":
        pytest.skip("this driver's nvidia-cuda-mps-control offers no MPS v3 namespaces (r615+)")
    backend = NvmlGpuBackend()
    gpu = backend.gpus()[0].uuid
    root = Path(tempfile.mkdtemp(prefix="tm-"))
    layout = LaneLayout(root, "v3", "gpu")
    daemons = LaneDaemons(
        LaneDirs(root), layout=layout, compute_modes=ComputeModes(backend, root / "compute-modes.json")
    )
    seen: dict[str, object] = {}

    async def scenario() -> None:
        try:
            small = await daemons.ensure("small", LaneLimits((gpu,), (1024,), 25))
            large = await daemons.ensure("large", LaneLimits((gpu,), (4096,), 100))
            seen["compute_mode"] = backend.compute_mode(gpu)
            seen["small_alloc"] = await asyncio.to_thread(
                client_in,
                small.pipe,
                small.shm,
                gpu,
                ["2048"],
                {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"},
            )
            seen["large_alloc"] = await asyncio.to_thread(client_in, large.pipe, large.shm, gpu, ["2048"])
            seen["small_sms"] = await asyncio.to_thread(
                client_in, small.pipe, small.shm, gpu, ["smid", "4096"]
            )
            seen["large_sms"] = await asyncio.to_thread(
                client_in, large.pipe, large.shm, gpu, ["smid", "4096"]
            )
            ns = mps_v3.namespace_name("small")
            manager = daemons.running("small")
            assert manager is not None
            seen["limit_before"] = await manager.cli("namespace", "get", ns, "tessera", "pinned-memory-limit")
            raise_it = subprocess.run(
                [
                    "nvidia-cuda-mps-control",
                    "namespace",
                    "set",
                    ns,
                    "--server=tessera",
                    "--pinned-memory-limit=8G",
                ],
                env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(small.pipe)},
                capture_output=True,
                text=True,
                timeout=30,
            )
            seen["control_from_namespace"] = (
                raise_it.returncode,
                raise_it.stdout.strip(),
                raise_it.stderr.strip(),
            )
            seen["limit_after"] = await manager.cli("namespace", "get", ns, "tessera", "pinned-memory-limit")
        finally:
            await daemons.close()
            for key in ("small", "large"):
                await daemons.release(key)
            seen["compute_mode_after"] = backend.compute_mode(gpu)
            backend.close()

    asyncio.run(scenario())
    print("MPS v3 lanes on one GPU:", json.dumps(seen, indent=1))
    assert seen["compute_mode"] == "ExclusiveProcess"
    assert seen["small_alloc"].get("alloc_result") == 2  # type: ignore[union-attr]
    assert seen["large_alloc"].get("alloc_result") == 0  # type: ignore[union-attr]
    small_sms, large_sms = seen["small_sms"], seen["large_sms"]
    assert isinstance(small_sms, dict) and isinstance(large_sms, dict)
    total = int(small_sms["total_sms"])
    assert int(small_sms["sms"]) <= total * 0.25 + 2 < int(large_sms["sms"]), (small_sms, large_sms)
    assert seen["limit_after"] == seen["limit_before"], seen
