"""TrialGroup end to end on a real control plane: Fluid's plan as pods the real kube-scheduler binds through
the extender — several small trials on lanes of one GPU (one GPU UUID, each lane its memory and compute),
a big trial as a multi-GPU pod — and a re-plan when trials succeed (a wider pod replaces the old one).

Worked example (as tests/integration/operator/test_trialgroup.py, Fluid Algorithm 3.1): h = (600,
100, 100, 100) s on n = 3 GPUs with c = 3 → A: 2 GPUs; B, C, D: 1/3 of the third GPU each, 16384 // 3 =
5461 MiB and 33 % of its SMs. When B, C and D finish and A reported 300 iterations, DynamicFluid gives A
all 3 GPUs.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import traceback
from typing import Any

from tessera.api import contract

from .conftest import Credentials, Nodes, Scheduling, running_operator, set_pod_phase, wait_for
from .controlplane import ControlPlane
from .workloads import (
    assignment_of,
    bound,
    call,
    cr_path,
    events,
    kubelet,
    operator,
    placement_of,
    pods_with,
    scheduling_report,
    status_of,
)

TEMPLATE = {"spec": {"containers": [{"name": "trial", "image": "trainer:1"}]}}
GROUP = [
    {"name": "a", "budgetIterations": 600, "iterTimeSeconds": 1.0, "config": {"lr": 0.1}},
    *({"name": n, "budgetIterations": 100, "iterTimeSeconds": 1.0, "config": {}} for n in ("b", "c", "d")),
]


def tg_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_TRIALGROUP,
        "metadata": {"name": name},
        "spec": {"template": TEMPLATE, "trials": GROUP, "gpus": 3, "fluid": {"maxPackPerGPU": 3}},
    }


def by_trial(cluster: ControlPlane, ns: str) -> dict[str, list[dict[str, Any]]]:
    """Live trial pods (not being deleted, not exited) by trial name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods_with(cluster, ns, contract.LABEL_TRIALGROUP, "tg"):
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            out.setdefault(pod["metadata"]["labels"][contract.LABEL_TRIAL], []).append(pod)
    return out


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"]["limits"])


async def report_progress(
    cluster: ControlPlane, agent: Credentials, ns: str, pod: str, **report: Any
) -> None:
    """What the node agent writes when a trial reports progress: the pod's tessera.io/progress, under the
    agent's own ServiceAccount."""
    body = {"metadata": {"annotations": {contract.ANN_PROGRESS: json.dumps(report)}}}
    await call(
        cluster,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod}",
        body,
        token=agent.token,
        content_type="application/merge-patch+json",
    )


async def test_trials_packed_on_lanes_then_replanned_when_trials_succeed(
    cluster: ControlPlane,
    chart_rbac: dict[str, Credentials],
    scheduling: Scheduling,
    nodes: Nodes,
    namespace: str,
) -> None:
    # Slots enough for four pods on three GPUs: the extender, not the slot count, decides who shares a GPU.
    node = nodes.add(f"{namespace}-n1", gpus=4, slots_per_gpu=contract.DEFAULT_SLOTS_PER_GPU)
    agent = chart_rbac["agent"]
    async with kubelet(cluster, namespace) as kl, operator(cluster, chart_rbac["operator"], namespace):
        await call(cluster, "POST", cr_path(contract.PLURAL_TRIALGROUP, namespace), tg_body("tg"))
        got = await wait_for(
            lambda: (
                (t := by_trial(cluster, namespace))
                and len(t) == 4
                and bound([p for ps in t.values() for p in ps])
                and t
            ),
            120,
            "four trial pods bound",
            lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
        )
        (a,) = got["a"]
        assert placement_of(a) == {"node": node, "gpuIndices": [0, 1]} and a["spec"]["nodeName"] == node
        assert limits(a) == {contract.RESOURCE_GPU: "2"}
        assert assignment_of(a)["gpuUUIDs"] == [f"GPU-{node}-0", f"GPU-{node}-1"]
        env = {e["name"]: e["value"] for e in a["spec"]["containers"][0]["env"]}
        assert env[contract.ENV_TRIAL] == "a" and json.loads(env[contract.ENV_TRIAL_CONFIG]) == {"lr": 0.1}
        lanes = set()
        for name in ("b", "c", "d"):
            (pod,) = got[name]
            assert placement_of(pod) == {"node": node, "gpuIndices": [2]} and pod["spec"]["nodeName"] == node
            assert limits(pod) == {
                contract.RESOURCE_GPU: "1",
                contract.RESOURCE_GPU_MEMORY: "5461",
                contract.RESOURCE_GPU_COMPUTE: "33",
            }
            # The extender put the three on lanes of the same physical GPU, each with its lane's share.
            assignment = assignment_of(pod)
            assert assignment["gpuUUIDs"] == [f"GPU-{node}-2"]
            assert (assignment["memoryMiB"], assignment["computePercent"]) == (5461, 33)
            lanes.add(assignment["laneId"])
        assert len(lanes) == 3
        st = await wait_for(
            lambda: (
                (s := status_of(cluster, contract.PLURAL_TRIALGROUP, namespace, "tg")).get("trialsRunning")
                == 4
                and s
            ),
            60,
            "status with four trials running",
        )
        assert {t["name"]: t["width"] for t in st["trials"]} == {"a": 2.0, "b": 1 / 3, "c": 1 / 3, "d": 1 / 3}
        assert st["gpus"] == 3 and st["estimatedMakespanSeconds"] == 300.0
        tg = cluster.get(cr_path(contract.PLURAL_TRIALGROUP, namespace, "tg"))
        assert json.loads(tg["metadata"]["annotations"][contract.ANN_GPU_POOL]) == [
            f"{node}/0",
            f"{node}/1",
            f"{node}/2",
        ]

        # The kubelet's part (phases) and the agent's (progress): A is half way, B, C and D finish.
        old_a = a["metadata"]["name"]
        await asyncio.to_thread(set_pod_phase, cluster, namespace, old_a, "Running")
        await report_progress(cluster, agent, namespace, old_a, iterations=300, loss=0.42)
        await wait_for(
            lambda: any(
                t.get("iterationsDone") == 300
                for t in status_of(cluster, contract.PLURAL_TRIALGROUP, namespace, "tg").get("trials", [])
            ),
            60,
            "A's progress in status",
        )
        # B and C report their budget and exit. D reports its budget but has not exited yet: the report
        # (the agent's write) and the exit (the kubelet's) are apart, and a re-plan may fall in between.
        lane_pods = {n: got[n][0]["metadata"]["name"] for n in "bcd"}
        for name in "bcd":
            await asyncio.to_thread(set_pod_phase, cluster, namespace, lane_pods[name], "Running")
            await report_progress(cluster, agent, namespace, lane_pods[name], iterations=100, loss=0.9)
        for name in "bc":
            await asyncio.to_thread(set_pod_phase, cluster, namespace, lane_pods[name], "Succeeded")
        st = await wait_for(
            lambda: (
                (s := status_of(cluster, contract.PLURAL_TRIALGROUP, namespace, "tg")).get("trialsDone") == 3
                and s
            ),
            60,
            "status with three trials done",
        )
        trials = {t["name"]: t for t in st["trials"]}
        assert all(trials[n]["phase"] == "Completed" and trials[n]["result"] == 0.9 for n in "bcd")
        assert trials["a"]["width"] == 3.0 and trials["a"]["iterationsDone"] == 300
        assert trials["a"]["result"] == 0.42 and st["estimatedMakespanSeconds"] == 100.0
        (new_a,) = await wait_for(
            lambda: (p := by_trial(cluster, namespace).get("a")) and p[0]["metadata"]["name"] != old_a and p,
            60,
            "A re-planned onto 3 GPUs",
        )
        assert placement_of(new_a) == {"node": node, "gpuIndices": [0, 1, 2]}
        assert limits(new_a) == {contract.RESOURCE_GPU: "3"}
        new_name = new_a["metadata"]["name"]
        # D's pod still runs on its lane of GPU 2, so the extender keeps A's wider pod off that GPU.
        refused = await wait_for(
            lambda: [
                e
                for e in events(cluster, namespace, "FailedScheduling")
                if e["involvedObject"]["name"] == new_name
            ],
            60,
            "kube-scheduler to refuse A's new pod while D's lane is held",
        )
        # (How much of GPU 2 is free depends on whether the extender saw B and C exit before that attempt.)
        assert re.search(r"GPU 2 has \d+ MiB free, pod needs 16384", refused[0]["message"]), refused[0][
            "message"
        ]
        await asyncio.to_thread(set_pod_phase, cluster, namespace, lane_pods["d"], "Succeeded")
        try:
            (new_a,) = await wait_for(
                lambda: (p := by_trial(cluster, namespace).get("a")) and bound(p) and p,
                120,
                "A's new pod bound",
                lambda: scheduling_report(cluster, namespace, scheduling=scheduling),
            )
        except AssertionError as err:
            # Which refusals kube-scheduler got after D ended, and when: a retry the extender answered
            # before it saw D end leaves the pod waiting for the next cluster event.
            tried = [
                (e.get("lastTimestamp") or e.get("eventTime"), e.get("count"), e.get("message", "")[:200])
                for e in events(cluster, namespace, "FailedScheduling")
                if e["involvedObject"]["name"] == new_name
            ]
            raise AssertionError(f"{err}\nFailedScheduling of {new_name}: {tried}") from err
        assert assignment_of(new_a)["gpuUUIDs"] == [f"GPU-{node}-{i}" for i in range(3)]
        # A's old pod went with the preemption grace; the finished trials' pods were never deleted.
        await wait_for(lambda: old_a in kl.grace, 60, "A's old pod deleted")
        assert kl.grace[old_a] == 5 and not set(lane_pods.values()) & set(kl.grace)
        kept = pods_with(cluster, namespace, contract.LABEL_TRIALGROUP, "tg")
        assert sorted(
            p["metadata"]["name"] for p in kept if p["status"].get("phase") == "Succeeded"
        ) == sorted(lane_pods.values())
        await wait_for(
            lambda: len(events(cluster, namespace, "TrialCompleted")) == 3, 60, "TrialCompleted x3"
        )


async def test_deletion_during_a_tick_waits_for_the_tick_not_a_minute(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    """A TrialGroup deleted while its timer's pass is running is let go once that pass ends. kopf keeps the
    finalizer while a timer of the object still runs and, by default, looks again only 60 s later: on a
    loaded machine, where passes take longer, the deletion often fell inside one, and cleanup timed out."""
    nodes.add(f"{namespace}-n1", gpus=4)
    key = (namespace, "tg")
    async with kubelet(cluster, namespace), running_operator(cluster, chart_rbac["operator"]) as ctl:
        await call(cluster, "POST", cr_path(contract.PLURAL_TRIALGROUP, namespace), tg_body("tg"))
        # kopf writes its diff base once the create handler has succeeded: from then on only the timer
        # (tick) passes over the object, as long as its spec does not change.
        path = cr_path(contract.PLURAL_TRIALGROUP, namespace, "tg")
        await wait_for(
            lambda: (
                "kopf.zalando.org/last-handled-configuration"
                in ((cluster.get(path) or {}).get("metadata", {}).get("annotations") or {})
            ),
            60,
            "the create handler to finish",
        )
        tuning = ctl.trialgroups
        assert tuning is not None and key in tuning.records
        # Hold the next pass (a tick) mid-way.
        entered, gate = asyncio.Event(), asyncio.Event()
        reconcile = tuning.reconcile

        callers: list[str] = []  # who ran the held pass: a failure below says whether it was the timer

        async def held(body: dict[str, Any], patch: Any) -> Any:
            meta = body["metadata"]
            # This test's TrialGroup only: the operator watches the whole cluster, and holding another
            # object's pass (an earlier test's, left in its Terminating namespace) let "tg" go at once.
            if (meta.get("namespace"), meta.get("name")) == key and not meta.get("deletionTimestamp"):
                if not entered.is_set():
                    callers.extend(f.name for f in traceback.extract_stack()[-8:-1])
                entered.set()
                await gate.wait()
            return await reconcile(body, patch)

        tuning.reconcile = held  # type: ignore[method-assign]
        await asyncio.wait_for(entered.wait(), 60)
        await call(cluster, "DELETE", path)
        # The deletion handler ran (it forgets the record) while the tick was still held.
        await wait_for(lambda: key not in tuning.records, 60, "the deletion handler")
        assert not gate.is_set() and cluster.get(path), f"deleted while the pass held from {callers} ran"
        gate.set()
        released = time.monotonic()
        await wait_for(
            lambda: cluster.request("GET", path)[0] == 404,
            90,
            "the TrialGroup to be deleted",
        )
        # kopf's default re-check (60 s) would take a minute here; the operator's is 1 s.
        assert time.monotonic() - released < 20
