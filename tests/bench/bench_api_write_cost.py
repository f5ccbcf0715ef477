"""Benchmark: what one request of each kind the arbiter's round sends costs the real API server, in CPU.

    .venv/bin/python tests/bench/bench_api_write_cost.py [--sizes 100,400] [--concurrency 8] [--no-cel]

A fresh control plane (tests/integration/k8s/controlplane.py) with the chart's CRDs; N Apps (two jobs each),
then N requests of each kind, 8 at a time over kept-alive HTTPS connections as cluster-admin: App status
patches (the round's writes: merge patch of the whole status as the operator sends it, of one field, a JSON
patch, a PUT of the status subresource), an annotation patch, App GETs, and for comparison pod creates,
pod deletes (grace 0) and events. Per kind: kube-apiserver's and etcd's CPU seconds per request (from
/proc, so a loaded machine inflates wall time more than these), and the ratio to a pod create, the
baseline. `--no-cel` applies the CRDs without their x-kubernetes-validations, to see whether the CEL rules
are what a status write pays for.

Why: at 1000 Apps the round writes ~430 App statuses, ~160 pod creates and ~160 deletes (see
bench_arbiter_realcluster.py); this says which of them the API server's share of the round is made of.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.api import contract  # noqa: E402

from tests.bench.bench_arbiter_realcluster import cpu_seconds  # noqa: E402
from tests.integration.k8s.conftest import apply_crds  # noqa: E402
from tests.integration.k8s.controlplane import ADMIN_TOKEN, ControlPlane, control_plane  # noqa: E402

NS = "bench"
BASELINE = "pod create"


class Client:
    """cluster-admin over one kept-alive HTTPS connection per thread (no TLS handshake per request)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.local = threading.local()
        self.ctx = ssl.create_default_context(cafile=str(plane.ca_file))

    def __call__(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.plane.bind_address, self.plane.api_port, context=self.ctx)
            self.local.conn = conn
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        if data is not None:
            headers["Content-Type"] = ctype
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {raw[:300]!r}")
        return json.loads(raw)


def crds_without_cel() -> Path:
    """The chart's CRDs with every x-kubernetes-validations removed, in a temporary directory."""

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            node.pop("x-kubernetes-validations", None)
            for v in node.values():
                strip(v)
        elif isinstance(node, list):
            for v in node:
                strip(v)

    out = Path(tempfile.mkdtemp(prefix="tessera-crds-"))
    for f in (ROOT / "charts" / "tessera" / "crds").glob("*.yaml"):
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        strip(docs)
        (out / f.name).write_text(yaml.safe_dump_all(docs))
    return out


def app(i: int) -> dict[str, Any]:
    job = {"iterTotal": 1000, "iterTimeSerialSeconds": 1.0, "maxGPUs": 2}
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        "metadata": {"name": f"a{i}"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "train", "image": "train:1"}]}},
            "jobs": [{"name": "j0", **job}, {"name": "j1", **job}],
        },
    }


def status(i: int, k: int) -> dict[str, Any]:
    """An App status as a round writes it (one lease of two GPUs, two jobs, Ready)."""
    return {
        "phase": "Running",
        "gpus": 2,
        "rho": 1.2 + k,
        "elapsedSeconds": 100.0 + k,
        "activeGPUSeconds": 50.0 + k,
        "observedGeneration": 1,
        "startTime": "2026-11-28T00:00:00Z",
        "jobs": [
            {"name": "j0", "state": "active", "gpus": 2, "itersRemaining": 900, "avgTimePerIterSeconds": 1.0},
            {"name": "j1", "state": "pending", "gpus": 0, "itersRemaining": 1000},
        ],
        "leases": [
            {
                "job": "j0",
                "node": f"node-{i % 60}",
                "gpuIndices": [0, 1],
                "expiresAt": f"2026-11-28T01:{k:02d}:00Z",
                "source": "auction",
            }
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Running",
                "message": "2 GPUs",
                "lastTransitionTime": "2026-11-28T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "labels": {contract.LABEL_APP: f"a{i}"}},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {"name": "c", "image": "train:1", "resources": {"limits": {contract.RESOURCE_GPU: "2"}}}
            ],
        },
    }


def run_size(n: int, concurrency: int, no_cel: bool) -> dict[str, tuple[float, float, float]]:
    """kube-apiserver ms, etcd ms and wall ms per request, by kind, at N objects."""
    out: dict[str, tuple[float, float, float]] = {}
    with control_plane() as plane:
        if no_cel:
            plane.kubectl("apply", "--server-side", "-f", str(crds_without_cel()))
            plane.kubectl(
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                f"crd/{contract.PLURAL_APP}.{contract.GROUP}",
            )
        else:
            apply_crds(plane)
        pids = {p.name: p.popen.pid for p in plane.processes}
        call = Client(plane)
        call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        apps = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL_APP}"
        pods = f"/api/v1/namespaces/{NS}/pods"
        held: dict[int, Any] = {}

        def get_app(i: int) -> None:
            held[i] = call("GET", f"{apps}/a{i}")

        def put_status(i: int) -> None:
            held[i]["status"] = status(i, 9)
            call("PUT", f"{apps}/a{i}/status", held[i])

        merge = "application/merge-patch+json"
        kinds: list[tuple[str, Callable[[int], Any]]] = [
            ("App create", lambda i: call("POST", apps, app(i))),
            ("App status merge patch, whole status", lambda i: call("PATCH", f"{apps}/a{i}/status", {"status": status(i, 1)}, merge)),
            ("App status merge patch, again", lambda i: call("PATCH", f"{apps}/a{i}/status", {"status": status(i, 2)}, merge)),
            ("App status merge patch, one field", lambda i: call("PATCH", f"{apps}/a{i}/status", {"status": {"rho": 9.5}}, merge)),
            ("App status JSON patch, one field", lambda i: call("PATCH", f"{apps}/a{i}/status", [{"op": "replace", "path": "/status/rho", "value": 3.5}], "application/json-patch+json")),
            ("App GET", get_app),
            ("App status PUT", put_status),
            ("App annotation merge patch", lambda i: call("PATCH", f"{apps}/a{i}", {"metadata": {"annotations": {"x": str(i)}}}, merge)),
            (BASELINE, lambda i: call("POST", pods, pod(i))),
            ("pod delete (grace 0)", lambda i: call("DELETE", f"{pods}/p{i}", {"gracePeriodSeconds": 0})),
            ("event create", lambda i: call("POST", f"/api/v1/namespaces/{NS}/events", {
                "metadata": {"name": f"e{i}"}, "reason": "LeaseGranted", "message": "m", "type": "Normal",
                "involvedObject": {"kind": contract.KIND_APP, "name": f"a{i}", "namespace": NS}})),
        ]  # fmt: skip
        for label, fn in kinds:
            time.sleep(2)  # what the previous kind set off (watch fan-out, GC) settles first
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            t0 = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(fn, range(n)))
            wall = time.perf_counter() - t0
            after = {k: cpu_seconds(p) for k, p in pids.items()}
            api = (after["kube-apiserver"] - before["kube-apiserver"]) / n * 1000
            etcd = (after["etcd"] - before["etcd"]) / n * 1000
            out[label] = (api, etcd, wall / n * 1000)
            print(
                f"N={n}: {label}: {api:.1f} ms of kube-apiserver CPU a request", file=sys.stderr, flush=True
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,400", help="Apps (and requests of each kind) per run")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-cel", action="store_true", help="apply the CRDs without their CEL rules")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {n: run_size(n, args.concurrency, args.no_cel) for n in sizes}
    print(f"\nCPU per request (ms) by kind; ratio = kube-apiserver CPU / that of a {BASELINE}")
    print(f"{'kind':40s}" + "".join(f" | N={n}: apiserver  etcd  wall  ratio" for n in sizes))
    for label in results[sizes[0]]:
        row = f"{label:40s}"
        for n in sizes:
            api, etcd, wall = results[n][label]
            base = results[n][BASELINE][0]
            row += f" | {api:14.1f} {etcd:5.1f} {wall:5.1f} {api / base:5.1f}x"
        print(row)


if __name__ == "__main__":
    main()
