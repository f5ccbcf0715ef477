"""FGD's experiment, scaled down, through the real kube-scheduler (the shipped KubeSchedulerConfiguration)
and the real extender over HTTP: a sample of Alibaba's nodes (every 48th: 26 nodes, 128 GPUs, as Node objects
with the agent's GPU annotation, CPU, memory and `tessera.io/gpu` slots) and pods drawn from the pod list
until the GPUs asked reach their capacity, every pod with schedulerName tessera-scheduler (CPU-only pods
routed there too), created one at a time, each bound or found unschedulable before the next.

What this pins: the GPU share left unallocated at 100 % arrived equals the simulator's as-deployed mode
(tessera.sim.packing.deployed, profiles read from the same configuration) on the same sample and arrivals,
and is no more than FGD's (as its artifact runs it) there.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from tessera.api import contract
from tessera.policy.lanes.packing import PackingConfig
from tessera.sim.packing.deployed import AsDeployed, profile_from_config
from tessera.sim.packing.experiment import arrivals, run
from tessera.sim.packing.scenario import PackingScenario, fgd_policy
from tessera.sim.packing.through_extender import extender_shapes, node_object, nominal_nodes, pod_object
from tessera.sim.packing.trace import read_nodes, read_pods

from tests.requires import missing

from .conftest import Scheduling
from .controlplane import ROOT, ControlPlane, wait_until

TRACE = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
EVERY, SEED, SLOTS = 48, 0, 10


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions") or []
    )


def settled(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod if pod and (pod["spec"].get("nodeName") or unschedulable(pod)) else None


def test_replay_matches_the_as_deployed_simulator(
    cluster: ControlPlane, scheduling: Scheduling, namespace: str
) -> None:
    if not TRACE.is_dir():
        missing(f"Alibaba's trace is not at {TRACE}")
    nodes = nominal_nodes(read_nodes(TRACE / "openb_node_list_gpu_node.csv")[::EVERY])
    pods = read_pods(TRACE / "openb_pod_list_default.csv")
    capacity = float(sum(n.gpus for n in nodes))
    stream = arrivals(pods, capacity, SEED)
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
            cluster.request(
                "PATCH",
                f"/api/v1/nodes/{n.name}",
                {"spec": {"taints": None}},
                content_type="application/merge-patch+json",
            )
        time.sleep(2)  # the extender's watch has the nodes
        bound: dict[int, str] = {}
        t0 = time.monotonic()
        for i, s in enumerate(stream):
            pod = pod_object(i, s)
            for key in ("uid", "resourceVersion"):
                del pod["metadata"][key]
            pod["metadata"]["namespace"] = namespace
            del pod["status"]
            status, out = cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
            assert status == 201, out
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
        real = 100 * (1 - sum(stream[i].gpu_share for i in bound) / capacity)

        config = yaml.safe_load((ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text())
        prof = profile_from_config(config, contract.SCHEDULER_NAME)
        # the shapes the extender reads from the pods (GPU memory in MiB of the nominal 1000 MiB GPUs)
        shapes = extender_shapes(stream)
        sim = run(nodes, shapes, AsDeployed(prof, prof, PackingConfig().policy(), slots_per_gpu=SLOTS), SEED)
        scenario = PackingScenario("", "replay", nodes, pods, [SEED], ["fgd"])
        fgd = run(nodes, stream, fgd_policy(scenario, sorted({n.model for n in nodes})), SEED)
        print(
            f"\nreplay: {len(nodes)} nodes, {int(capacity)} GPUs, {len(stream)} pods in {took:.0f} s; unallocated at "
            f"100 %: real scheduler {real:.2f} %, simulator as deployed {100 * sim.unallocated[-1]:.2f} %, "
            f"FGD {100 * fgd.unallocated[-1]:.2f} %"
        )
        names = [n.name for n in nodes]
        same = sum((bound.get(i) == (names[p[0]] if p else None)) for i, p in enumerate(sim.picks))
        assert real == pytest.approx(100 * sim.unallocated[-1], abs=0.5), (same, len(stream))
        assert real <= 100 * fgd.unallocated[-1] + 0.5
    finally:
        for name in created:
            cluster.request("DELETE", f"/api/v1/nodes/{name}")
