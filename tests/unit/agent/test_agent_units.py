"""Unit tests of the agent's pure parts: generated protos current, slot IDs, assignments, Allocate choices."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tessera.api import contract
from tessera.api.assignment import Assignment, AssignmentError
from tessera_agent.config import AgentConfig
from tessera_agent.gpus.backend import MIB, GpuDevice, usable_memory_mib
from tessera_agent.kubelet.allocate import (
    AllocateRequestError,
    choose_pod,
    container_allocation,
    preferred_slots,
)
from tessera_agent.kubelet.slots import gpu_of, slot_id, slot_ids
from tessera_agent.pods import NodePod, pod_info_from_manifest

ROOT = Path(__file__).resolve().parents[3]
U0, U1 = "GPU-fef8089b-4820-abfc-e83e-94318197576e", "GPU-0a0b0c0d-4820-abfc-e83e-94318197576f"


def test_generated_protobuf_modules_are_current() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-protos"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_proto_declares_the_kubelets_v1beta1_api() -> None:
    text = (ROOT / "device-plugin" / "tessera_agent" / "proto" / "api.proto").read_text()
    assert 'option go_package = "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1";' in text
    for rpc in (
        "Register",
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ):
        assert f"rpc {rpc}(" in text


def test_slot_ids_round_trip_and_fit_63_chars() -> None:
    ids = slot_ids(U0, 10)
    assert ids[3] == f"{U0}::3" and all(len(i) <= 63 for i in ids)
    assert {gpu_of(i) for i in ids} == {U0}
    with pytest.raises(ValueError, match="not a Tessera slot ID"):
        gpu_of("nvidia0")
    with pytest.raises(ValueError, match="63"):
        slot_id("GPU-" + "x" * 60, 1)


def test_usable_memory_deducts_driver_reserve() -> None:
    g = GpuDevice(0, U0, "A100", 40960 * MIB, 585 * MIB)
    assert usable_memory_mib(g) == 40375
    assert usable_memory_mib(g, 375) == 40000


def assignment(**over: object) -> str:
    a = {
        "node": "n",
        "gpuUUIDs": [U0],
        "gpuIndices": [0],
        "laneId": "l1",
        "memoryMiB": 1024,
        "computePercent": 50,
    }
    a.update(over)
    return json.dumps(a)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "Invalid JSON"),
        ("[]", "should be an object"),
        (json.dumps({"node": "n"}), "gpuUUIDs Field required"),
        (assignment(gpuUUIDs=[]), "gpuUUIDs List should have at least 1 item"),
        (assignment(memoryMiB=0), "memoryMiB Input should be greater than 0"),
        (assignment(computePercent=101), "computePercent Input should be less than or equal to 100"),
        (assignment(gpuIndices=[0, 1]), "differ in length"),
    ],
)
def test_bad_assignments_say_why(raw: str, message: str) -> None:
    with pytest.raises(AssignmentError, match=message):
        Assignment.parse(raw)


def pod(name: str, n: int, created: str, gpus: list[str] | None, allocated: bool = False) -> NodePod:
    ann = (
        {contract.ANN_ASSIGNMENT: assignment(gpuUUIDs=gpus, gpuIndices=list(range(len(gpus))))}
        if gpus
        else {}
    )
    if allocated:
        ann[contract.ANN_ALLOCATED] = "x"
    return pod_info_from_manifest(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": name,
                "creationTimestamp": created,
                "annotations": ann,
            },
            "spec": {"containers": [{"name": "c", "resources": {"limits": {contract.RESOURCE_GPU: str(n)}}}]},
        }
    )


def test_choose_pod_serves_the_one_waiting_pod_of_that_size_and_never_guesses() -> None:
    pods = [
        pod("on-u1", 1, "2024-01-01T00:00:00Z", [U1]),
        pod("two-gpus", 2, "2023-01-01T00:00:00Z", [U0, U1]),
        pod("done", 1, "2020-01-01T00:00:00Z", [U0], allocated=True),
        pod("no-assignment", 1, "2019-01-01T00:00:00Z", None),
    ]
    # one pod waits for one slot: it is the pod, whichever GPU's slot the kubelet picked
    assert choose_pod([f"{U0}::0"], pods, "n").name == "on-u1"
    assert choose_pod([f"{U0}::1", f"{U1}::1"], pods, "n").name == "two-gpus"
    with pytest.raises(AllocateRequestError, match=re.escape("requests 3 tessera.io/gpu")):
        choose_pod([f"{U0}::1", f"{U0}::2", f"{U0}::3"], pods, "n")
    with pytest.raises(AllocateRequestError, match="no pod on node other"):
        choose_pod([f"{U0}::0"], pods, "other")
    # two wait for one slot: the slot's GPU does not say which the kubelet admits (the slot was steered by a
    # preference given without knowing the pod either), so no rule picks one
    both = [*pods, pod("on-u0", 1, "2024-01-02T00:00:00Z", [U0])]
    with pytest.raises(
        AllocateRequestError, match=re.escape("2 pods on node n wait for 1 tessera.io/gpu at once")
    ):
        choose_pod([f"{U0}::0"], both, "n")
    # a pod the kubelet failed (or that finished) waits no more
    failed = [replace(p, phase="Failed") if p.name == "on-u1" else p for p in both]
    assert choose_pod([f"{U1}::0"], failed, "n").name == "on-u0"
    deleting = [replace(p, deleting=True) if p.name == "on-u1" else p for p in both]
    assert choose_pod([f"{U1}::0"], deleting, "n").name == "on-u0"


def test_unreadable_assignment_is_named_in_the_error() -> None:
    bad = pod_info_from_manifest(
        {
            "metadata": {
                "name": "b",
                "namespace": "ns",
                "uid": "b",
                "annotations": {contract.ANN_ASSIGNMENT: "{"},
            },
            "spec": {"containers": [{"name": "c", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
        }
    )
    with pytest.raises(
        AllocateRequestError,
        match=re.escape("ns/b: pod ns/b: tessera.io/assignment is malformed:  Invalid JSON"),
    ):
        choose_pod([f"{U0}::0"], [bad], "n")


def test_container_env_for_two_gpu_lane_by_ordinal_and_uuid() -> None:
    p = pod("two", 2, "", [U0, U1])
    cfg = AgentConfig(node_name="n", coordinator_socket=Path("/run/tessera/coord/lanes.sock"))
    envs = container_allocation(p, cfg).envs
    assert envs["CUDA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M,1=1024M"
    assert envs["TESSERA_COORDINATOR_SOCKET"] == "/run/tessera/coordinator/lanes.sock"
    by_uuid = container_allocation(p, AgentConfig(node_name="n", mem_limit_key="uuid")).envs
    assert by_uuid["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{U0}=1024M,{U1}=1024M"


def test_preferred_slots_spread_over_assigned_gpus() -> None:
    avail = [f"{U0}::{k}" for k in range(3)] + [f"{U1}::{k}" for k in range(3)]
    pods = [pod("two", 2, "", [U0, U1])]
    chosen = preferred_slots(avail, [], 2, pods, "n")
    assert {gpu_of(c) for c in chosen} == {U0, U1}
    assert preferred_slots(avail, [f"{U1}::2"], 1, [], "n") == [f"{U1}::2"]
    with pytest.raises(AllocateRequestError, match="only 6 devices"):
        preferred_slots(avail, [], 7, [], "n")


def test_agent_factory_creates_histograms_from_the_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest
    from tessera.api import metrics_catalog as catalog
    from tessera.api.metrics_catalog import Component, MetricSpec, MetricType
    from tessera_agent.metrics_factory import AgentMetrics

    spec = MetricSpec(
        "tessera_agent_allocate_seconds",
        MetricType.HISTOGRAM,
        "Allocate latency.",
        ("node",),
        frozenset({Component.AGENT}),
        buckets=(0.001, 0.01),
    )
    real = catalog.for_component(Component.AGENT)
    monkeypatch.setattr(catalog, "for_component", lambda c: [*real, spec])
    m = AgentMetrics()
    m.histogram("tessera_agent_allocate_seconds").labels(node="n1").observe(0.005)
    text = generate_latest(m.registry).decode()
    assert 'tessera_agent_allocate_seconds_bucket{le="0.01",node="n1"} 1.0' in text
    assert 'tessera_agent_allocate_seconds_bucket{le="0.001",node="n1"} 0.0' in text
    with pytest.raises(KeyError, match="not an agent histogram"):
        m.histogram("tessera_lane_memory_used_bytes")


def test_gpu_counts_are_read_as_canonical_quantities() -> None:
    """The API server returns 1000 as `1k`; a count the agent cannot read skips that container, no crash."""
    counts = {"a": "2", "b": "1k", "c": "1Ki", "d": "0.5"}
    info = pod_info_from_manifest(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "p"},
            "spec": {
                "containers": [
                    {"name": n, "resources": {"limits": {contract.RESOURCE_GPU: v}}}
                    for n, v in counts.items()
                ]
            },
        }
    )
    assert info.gpu_requests == (2, 1000)
