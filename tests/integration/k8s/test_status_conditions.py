"""Status conventions on a real API server: every kind gets a `Ready` condition that `kubectl wait` accepts,
and `status.observedGeneration` follows metadata.generation, which the API server bumps on spec changes
only. kubectl wait ignores a condition whose observedGeneration is older than the object's generation, so
a wait right after a spec change returns only once the operator reported on the new spec.

The operator runs as the chart's ServiceAccount. No scheduler runs: Ready asks for pods created, not
bound."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tessera.api import contract

from .conftest import Credentials, Nodes, running_operator, wait_for
from .controlplane import ControlPlane
from .workloads import events, modeldeployment, pods_with

G, V = contract.GROUP, contract.VERSION
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "trainer:1", "command": ["python", "t.py"]}]}}


def manifest(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": contract.API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


def app(name: str, gpus: int = 2, template: dict[str, Any] = TEMPLATE) -> dict[str, Any]:
    job = {"name": "j1", "iterTotal": 1000, "iterTimeSerialSeconds": 1.0, "maxGPUs": gpus}
    return manifest(contract.KIND_APP, name, {"template": template, "jobs": [job]})


def trialgroup(name: str) -> dict[str, Any]:
    trials = [{"name": t, "budgetIterations": 100, "iterTimeSeconds": 1.0} for t in ("a", "b")]
    return manifest(contract.KIND_TRIALGROUP, name, {"template": TEMPLATE, "trials": trials, "gpus": 2})


async def kubectl(cluster: ControlPlane, *args: str, stdin: str | None = None, check: bool = True) -> Any:
    """kubectl off the event loop (the operator under test shares it)."""
    return await asyncio.to_thread(cluster.kubectl, *args, stdin=stdin, check=check)


async def kubectl_wait(cluster: ControlPlane, ns: str, ref: str, condition: str = "condition=Ready") -> None:
    res = await kubectl(cluster, "wait", f"--for={condition}", "--timeout=90s", "-n", ns, ref, check=False)
    assert res.returncode == 0, f"kubectl wait --for={condition} {ref}: {res.stderr}{res.stdout}"


def get(cluster: ControlPlane, ns: str, plural: str, name: str) -> dict[str, Any]:
    obj = cluster.get(f"/apis/{G}/{V}/namespaces/{ns}/{plural}/{name}")
    assert obj is not None, f"{plural}/{name} is gone"
    return obj


def cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    assert len(found) == 1, f"one {type_} condition expected: {obj.get('status')}"
    return found[0]


def assert_reports_generation(obj: dict[str, Any], generation: int) -> dict[str, Any]:
    """The status and every condition say which spec they reflect; returns the Ready condition."""
    assert obj["metadata"]["generation"] == generation
    assert obj["status"]["observedGeneration"] == generation
    for c in obj["status"]["conditions"]:
        assert c["observedGeneration"] == generation, c
    ready = cond(obj, "Ready")
    assert ready["status"] == "True", ready
    return ready


async def change_spec(cluster: ControlPlane, ns: str, ref: str, patch: dict[str, Any]) -> None:
    await kubectl(cluster, "patch", "-n", ns, ref, "--type=merge", "-p", json.dumps(patch))


def printed_ready(cluster: ControlPlane, ns: str, ref: str) -> str:
    """The READY column of `kubectl get` (the CRD's printer column over the Ready condition)."""
    header, row = cluster.kubectl("get", "-n", ns, ref).stdout.splitlines()[:2]
    return dict(zip(header.split(), row.split(), strict=False))["READY"]


async def test_app_is_ready_once_its_leases_pods_exist_and_reports_each_generation(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    nodes.add(f"{namespace}-n1", gpus=2)
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(app("a")))
    async with running_operator(cluster, chart_rbac["operator"]):
        await kubectl_wait(cluster, namespace, "app/a")
        obj = get(cluster, namespace, contract.PLURAL_APP, "a")
        ready = assert_reports_generation(obj, 1)
        assert ready["reason"] == "Running" and "2 GPUs leased to job(s) j1" in ready["message"]
        assert cond(obj, "Admitted")["status"] == "True"
        assert obj["status"]["phase"] == "Running" and len(obj["status"]["leases"]) == 1
        assert len(pods_with(cluster, namespace, contract.LABEL_APP, "a")) == 1  # one pod: 2 GPUs, one node
        assert printed_ready(cluster, namespace, "app/a") == "True"

        await change_spec(
            cluster,
            namespace,
            "app/a",
            {
                "spec": {
                    "jobs": [{"name": "j1", "iterTotal": 2000, "iterTimeSerialSeconds": 1.0, "maxGPUs": 2}]
                }
            },
        )
        await kubectl_wait(cluster, namespace, "app/a")
        after = get(cluster, namespace, contract.PLURAL_APP, "a")
        ready2 = assert_reports_generation(after, 2)
        # Ready stayed True through the change: its transition time is the first one.
        assert ready2["lastTransitionTime"] == ready["lastTransitionTime"]
        assert after["status"]["jobs"][0]["itersRemaining"] == 2000
        assert after["status"]["leases"] == obj["status"]["leases"]


async def test_trialgroup_is_ready_once_its_trials_are_planned_and_their_pods_exist(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    nodes.add(f"{namespace}-n1", gpus=2)
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(trialgroup("tg")))
    async with running_operator(cluster, chart_rbac["operator"]):
        await kubectl_wait(cluster, namespace, "tg/tg")
        obj = get(cluster, namespace, contract.PLURAL_TRIALGROUP, "tg")
        ready = assert_reports_generation(obj, 1)
        assert ready["reason"] == "Running" and "2 trials planned on 2 GPUs" in ready["message"]
        assert [c["type"] for c in obj["status"]["conditions"]] == ["Valid", "Ready"]  # its own kept first
        assert len(pods_with(cluster, namespace, contract.LABEL_TRIALGROUP, "tg")) == 2
        assert printed_ready(cluster, namespace, "tg/tg") == "True"

        await change_spec(
            cluster, namespace, "tg/tg", {"spec": {"target": {"metric": "loss", "threshold": 0.1}}}
        )
        await kubectl_wait(cluster, namespace, "tg/tg")
        ready2 = assert_reports_generation(get(cluster, namespace, contract.PLURAL_TRIALGROUP, "tg"), 2)
        assert ready2["lastTransitionTime"] == ready["lastTransitionTime"]


async def test_modeldeployment_is_ready_at_the_wanted_replicas_with_gateway_and_workers(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    nodes.add(f"{namespace}-n1", gpus=2)
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(modeldeployment("m", 100)))
    async with running_operator(cluster, chart_rbac["operator"]):
        await kubectl_wait(cluster, namespace, "md/m")
        obj = get(cluster, namespace, contract.PLURAL_MODELDEPLOYMENT, "m")
        ready = assert_reports_generation(obj, 1)
        assert ready["reason"] == "Serving" and obj["status"]["replicas"] == 1
        assert cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/m-gateway") is not None
        assert printed_ready(cluster, namespace, "md/m") == "True"

        # 300 rps needs two replicas: Ready again only once the second one is placed with its worker.
        await change_spec(cluster, namespace, "md/m", {"spec": {"traffic": {"expectedRps": 300}}})
        await kubectl_wait(cluster, namespace, "md/m")
        after = get(cluster, namespace, contract.PLURAL_MODELDEPLOYMENT, "m")
        assert_reports_generation(after, 2)
        assert after["status"]["replicas"] == 2
        workers = [
            p
            for p in pods_with(cluster, namespace, contract.LABEL_MODELDEPLOYMENT, "m")
            if p["metadata"]["labels"].get(contract.LABEL_ROLE) == "worker"
        ]
        assert len(workers) == 2


async def test_an_app_whose_pods_the_api_server_refuses_is_not_ready_and_says_why(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    # The CRD leaves a container's image optional (as a PodTemplateSpec does, for webhooks that fill it
    # in); without such a webhook the API server refuses the pods, so the App can never run.
    nodes.add(f"{namespace}-n1", gpus=1)
    no_image = {"spec": {"containers": [{"name": "main"}]}}
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(app("bad", 1, no_image)))
    async with running_operator(cluster, chart_rbac["operator"]):
        await kubectl_wait(cluster, namespace, "app/bad", "condition=Ready=False")
        obj = await wait_for(
            lambda: (
                (o := get(cluster, namespace, contract.PLURAL_APP, "bad"))
                and cond(o, "Ready")["reason"] == "PodsNotCreated"
                and o
            ),
            90,
            "Ready=False with reason PodsNotCreated",
        )
        ready = cond(obj, "Ready")
        assert ready["status"] == "False" and "job(s) j1" in ready["message"]
        assert ready["observedGeneration"] == obj["status"]["observedGeneration"] == 1
        failed = await wait_for(lambda: events(cluster, namespace, "GangFailed"), 60, "a GangFailed event")
        assert "spec.containers[0].image" in failed[0]["message"]
        assert not pods_with(cluster, namespace, contract.LABEL_APP, "bad")
        assert printed_ready(cluster, namespace, "app/bad") == "False"


async def test_an_app_over_the_admission_threshold_is_not_ready_with_the_reason(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    nodes.add(f"{namespace}-n1", gpus=1)
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(app("big", 4)))
    async with running_operator(cluster, chart_rbac["operator"], admission_threshold=2.0):
        await kubectl_wait(cluster, namespace, "app/big", "condition=Ready=False")
        obj = get(cluster, namespace, contract.PLURAL_APP, "big")
    ready, admitted = cond(obj, "Ready"), cond(obj, "Admitted")
    assert (ready["reason"], admitted["status"], admitted["reason"]) == (
        "NotAdmitted",
        "False",
        "OverThreshold",
    )
    assert "admission threshold" in ready["message"] and obj["status"]["observedGeneration"] == 1
    assert not pods_with(cluster, namespace, contract.LABEL_APP, "big")


async def test_objects_the_operator_refuses_are_not_ready_with_invalid_spec(
    cluster: ControlPlane, chart_rbac: dict[str, Credentials], nodes: Nodes, namespace: str
) -> None:
    # Names the API server accepts but the operator cannot derive its objects from: an App's or a
    # TrialGroup's name is a label value on its pods (at most 63 characters), a ModelDeployment's names
    # Services (a DNS-1035 label: no dots).
    nodes.add(f"{namespace}-n1", gpus=2)
    long = "x" * 64
    refused = [
        (app(long), f"app/{long}", contract.PLURAL_APP, long),
        (trialgroup(long), f"tg/{long}", contract.PLURAL_TRIALGROUP, long),
        (modeldeployment("resnet.v2", 100), "md/resnet.v2", contract.PLURAL_MODELDEPLOYMENT, "resnet.v2"),
    ]
    for body, _, _, _ in refused:
        await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    async with running_operator(cluster, chart_rbac["operator"]):
        for _, ref, _, _ in refused:
            await kubectl_wait(cluster, namespace, ref, "condition=Ready=False")
    for _, ref, plural, name in refused:
        obj = get(cluster, namespace, plural, name)
        ready, valid = cond(obj, "Ready"), cond(obj, "Valid")
        assert (ready["reason"], valid["status"], valid["reason"]) == (
            "InvalidSpec",
            "False",
            "InvalidSpec",
        ), ref
        assert ready["message"] == valid["message"] and ready["message"].startswith("metadata.name: "), ref
        assert obj["status"]["phase"] == "Failed" and obj["status"]["observedGeneration"] == 1, ref
        assert ready["observedGeneration"] == valid["observedGeneration"] == 1, ref
    assert not (cluster.get(f"/api/v1/namespaces/{namespace}/pods") or {}).get("items")
