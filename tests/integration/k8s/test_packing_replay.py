"""FGD's experiment, scaled down, through the real kube-scheduler (the shipped KubeSchedulerConfiguration)
and the real extender over HTTP, deployed as with the chart's gpuNodes.reserve: a sample of Alibaba's nodes
(every 48th: 26 nodes, 132 GPUs, as Node objects with the agent's GPU annotation, CPU, memory,
`tessera.io/gpu` slots and the taint the agent puts on a reserved node), and pods drawn from the pod list
until the GPUs asked reach their capacity, created one at a time in a namespace labelled for routing and
naming no scheduler: the chart's MutatingAdmissionPolicy (rendered by the real Helm engine, enforced by the
real API server) sends each, CPU-only pods included, to tessera-scheduler with the toleration; each is bound
or found unschedulable before the next.

What this pins: the GPU share left unallocated at 95 and 100 % arrived equals the simulator's as-deployed
mode (tessera.sim.packing.deployed, reading the same rendered chart) on the same sample and arrivals, for
seeds 0-2 (FGD's figure is printed beside it; on a sample this small it swings by ±1.5 points from seed to
seed, so the comparison with FGD is made on the full trace by the simulator: docs/results-packing.md, and
test_packing_deployed_trace.py for this sample).
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from typing import Any

import pytest
from tessera.api import contract
from tessera.policy.lanes.fragmentation import Shape
from tessera.policy.lanes.packing import PackingConfig
from tessera.sim.packing.deployed import from_chart
from tessera.sim.packing.experiment import arrivals, run
from tessera.sim.packing.scenario import PackingScenario, fgd_policy
from tessera.sim.packing.through_extender import extender_shapes, node_object, nominal_nodes, pod_object
from tessera.sim.packing.trace import read_nodes, read_pods
from tessera_agent.reserve import reserve_taint

from tests.requires import missing

from .conftest import Scheduling, chart_objects, routed_to_tessera
from .controlplane import ROOT, ControlPlane, wait_until

TRACE = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
EVERY, SLOTS = 48, 10
LABELS = {contract.LABEL_GPU_NODES_NAMESPACE: "true"}
# One extender serves the module, and the shape distribution it learns from the pods it sees carries over
# from one seed's replay to the next: so does the simulated rule's.
RULE = PackingConfig().policy()


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions") or []
    )


def settled(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod if pod and (pod["spec"].get("nodeName") or unschedulable(pod)) else None


def metrics_text(scheduling: Scheduling) -> str:
    """The extender's /metrics: a series per GPU of every node in its view."""
    with urllib.request.urlopen(scheduling.metrics_url, timeout=5) as resp:
        return str(resp.read().decode())


def unallocated_at(stream: list[Shape], bound: dict[int, str], capacity: float, percent: int) -> float:
    """Percent of GPU capacity unallocated when the pods arrived first ask for `percent` of it."""
    asked = allocated = 0.0
    for i, s in enumerate(stream):
        asked += s.gpu_share
        allocated += s.gpu_share if i in bound else 0.0
        if asked >= percent / 100 * capacity - 1e-9:
            break
    return 100 * (1 - allocated / capacity)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_matches_the_as_deployed_simulator(
    cluster: ControlPlane,
    scheduling: Scheduling,
    gpu_nodes_policy: list[dict[str, Any]],
    namespace: str,
    seed: int,
) -> None:
    if not TRACE.is_dir():
        missing(f"Alibaba's trace is not at {TRACE}")
    # The namespace labelled as docs/operations.md tells an admin to (gpuNodes.reserve).
    status, out = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": LABELS}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, out
    # names per seed: kube-scheduler counts a deleted namespace's pods until they are gone
    sample = read_nodes(TRACE / "openb_node_list_gpu_node.csv")[::EVERY]
    nodes = [dataclasses.replace(n, name=f"s{seed}-{n.name}") for n in nominal_nodes(sample)]
    pods = read_pods(TRACE / "openb_pod_list_default.csv")
    capacity = float(sum(n.gpus for n in nodes))
    stream = arrivals(pods, capacity, seed)
    created: list[str] = []
    try:
        for n in nodes:
            body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", **node_object(n)}
            body["metadata"]["labels"] = {"kubernetes.io/hostname": n.name}
            alloc = {
                **body.pop("status")["allocatable"],
                "pods": "250",
                contract.RESOURCE_GPU: str(n.gpus * SLOTS),
            }
            status, out = cluster.request("POST", "/api/v1/nodes", body)
            assert status == 201, out
            created.append(n.name)
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "replay"}
            status, out = cluster.request(
                "PATCH",
                f"/api/v1/nodes/{n.name}/status",
                {"status": {"capacity": alloc, "allocatable": alloc, "conditions": [ready]}},
                content_type="application/merge-patch+json",
            )
            assert status == 200, out
            # The node lifecycle controller's not-ready taint goes (no kubelet here); the agent's stays.
            cluster.request(
                "PATCH",
                f"/api/v1/nodes/{n.name}",
                {"spec": {"taints": [reserve_taint()]}},
                content_type="application/merge-patch+json",
            )
        wait_until(
            lambda: all(f'node="{name}"' in metrics_text(scheduling) for name in created),
            60,
            "the extender's view to hold every replay node",
            scheduling.extender,
        )
        bound: dict[int, str] = {}
        t0 = time.monotonic()
        for i, s in enumerate(stream):
            pod = pod_object(i, s)
            for key in ("uid", "resourceVersion"):
                del pod["metadata"][key]
            pod["metadata"]["namespace"] = namespace
            del pod["status"], pod["spec"]["schedulerName"]  # the chart's policy routes it
            status, out = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
            assert status == 201, out
            assert routed_to_tessera(out), out["spec"]
            got = wait_until(
                lambda name=f"p{i}": settled(cluster, namespace, name),
                30,
                f"pod p{i} settled",
                scheduling.extender,
            )
            if got["spec"].get("nodeName"):
                bound[i] = got["spec"]["nodeName"]
            else:
                cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/p{i}")
        took = time.monotonic() - t0
        real = {p: unallocated_at(stream, bound, capacity, p) for p in (95, 100)}

        # What the chart with gpuNodes.reserve configures for this namespace's pods. Its KubeSchedulerConfiguration
        # equals the one kube-scheduler runs here in all that packing reads (test_chart_args.py keeps them so).
        deployed = from_chart(chart_objects({"gpuNodes": {"reserve": True}}), namespace, LABELS)
        assert deployed.routed and deployed.gpu_nodes_reserved
        # the shapes the extender reads from the pods (GPU memory in MiB of the nominal 1000 MiB GPUs)
        shapes = extender_shapes(stream)
        sim = run(nodes, shapes, deployed.policy(RULE, slots_per_gpu=SLOTS), seed)
        scenario = PackingScenario("", "replay", nodes, pods, [seed], ["fgd"])
        fgd = run(nodes, stream, fgd_policy(scenario, sorted({n.model for n in nodes})), seed)
        names = [n.name for n in nodes]
        same = sum((bound.get(i) == (names[p[0]] if p else None)) for i, p in enumerate(sim.picks))
        for p in (95, 100):
            ours, theirs = 100 * sim.unallocated[p - 1], 100 * fgd.unallocated[p - 1]
            print(
                f"\nreplay seed {seed}: {len(nodes)} nodes, {int(capacity)} GPUs, {len(stream)} pods in {took:.0f} s; "
                f"unallocated at {p} %: real scheduler {real[p]:.2f} %, simulator as deployed {ours:.2f} %, "
                f"FGD {theirs:.2f} %; {same} of {len(stream)} pods on the simulator's node"
            )
            assert real[p] == pytest.approx(ours, abs=0.5), (p, same, len(stream))
    finally:
        # Leave the shared control plane quiet for the tests after this one: the replay's few hundred pods
        # gone (not left to the namespace's deletion and pod GC, whose events flood every operator's watch
        # for minutes), then its nodes.
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
        wait_until(
            lambda: not (cluster.get(f"/api/v1/namespaces/{namespace}/pods") or {}).get("items"),
            180,
            "the replay's pods to be gone",
        )
        for name in created:
            cluster.request("DELETE", f"/api/v1/nodes/{name}")
