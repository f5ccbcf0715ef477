"""Processes and payloads for the gateway's loopback tests and benchmark: the early-exit demo model,
request bodies per application, and `tessera worker` / `tessera gateway` subprocesses on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tests.ports import free_port

WIDTH = 512
MODEL = "early-exit"
# Layers per application, (mean, sd): short and long requests, a bimodal mixture as in Orloj §5.
APP_LAYERS = {"short": (20, 2), "long": (80, 4)}
# The workers' modelled cost (`tessera worker --pace-*`): 1 ms per layer of the longest row, each extra row
# stretching the batch by 20% (s_k = 1 + 0.2(k − 1), a batching model of Tessera's
# choosing). Short requests take ~20 ms and long ones ~80 ms whatever else runs on the machine; the real
# ONNX run (~1 ms at 80 layers) still computes every output.
PACE = {"input": "n", "unit_ms": 1.0, "growth": 0.2}


def payloads(app: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` v2 request bodies for ``app``: random x, layer count drawn from the app's normal."""
    mean, sd = APP_LAYERS[app]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal(WIDTH).astype(np.float32)
        layers = max(1, round(float(rng.normal(mean, sd))))
        out.append(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1, WIDTH],
                        "datatype": "FP32",
                        "data": [round(float(v), 4) for v in x],
                    },
                    {"name": "n", "shape": [1, 1], "datatype": "INT64", "data": [layers]},
                ]
            }
        )
    return out


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args} exited with {proc.returncode}: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} was not ready within {timeout}s")


def _tessera(*args: str) -> list[str]:
    return [sys.executable, "-m", "tessera.cli", *args]


@contextmanager
def worker_process(
    model_path: Path, port: int | None = None, pace: dict[str, Any] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A `tessera worker` on loopback; ``pace`` ({input, unit_ms, growth}) sets its modelled cost."""
    port = port or free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["worker", "--model", str(model_path), "--name", MODEL, "--port", str(port)]
    if pace is not None:
        args += ["--pace-input", pace["input"], "--pace-unit-ms", str(pace["unit_ms"])]
        args += ["--pace-growth", str(pace.get("growth", 0.0))]
    proc = subprocess.Popen(
        _tessera(*args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, proc
    finally:
        stop(proc)


@contextmanager
def gateway_process(
    config: dict[str, Any], tmp: Path, *, grpc_port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    extra = ["--grpc-port", str(grpc_port)] if grpc_port is not None else []
    proc = subprocess.Popen(
        _tessera("gateway", "--config", str(path), "--port", str(port), *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def model_config(
    policy: str, workers: list[str], calib: dict[str, Any], slo_s: float, **extra: Any
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": MODEL,
        "policy": policy,
        "slo_s": slo_s,
        "workers": workers,
        "batch_sizes": [1, 2, 4, 8],
        "max_batch": 8,
        **calib,
        **extra,
    }
    return {"models": [cfg], "health_interval_s": 0.2}


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)
