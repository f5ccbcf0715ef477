"""Chart value queueAdmission.enabled: the MutatingAdmissionPolicy that makes other pods asking for
tessera.io/gpu wait in their namespace's queue (docs/queues.md, "Pods and Jobs in a queue"). Rendered by the
real Helm engine; the policy itself runs on the real API server in
tests/integration/k8s/test_queue_admission.py."""

from __future__ import annotations

from typing import Any

from tessera.api import contract

from .chart_render import NAMESPACE, objects, render

KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def policies(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {
        o["kind"]: o
        for o in objects(render(values))
        if o["kind"] in KINDS and o["metadata"]["labels"]["app.kubernetes.io/component"] == "queue-admission"
    }


def test_on_by_default_for_the_namespaces_of_queues() -> None:
    got = policies(None)
    policy, binding = got["MutatingAdmissionPolicy"], got["MutatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert {"key": contract.LABEL_QUEUE, "operator": "Exists"} in selector["matchExpressions"]
    assert {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", NAMESPACE],
    } in selector["matchExpressions"]
    # The names the operator reads are the contract's.
    (mutation,) = spec["mutations"]
    expression = mutation["applyConfiguration"]["expression"]
    assert f'"{contract.LABEL_QUEUED}": "true"' in expression
    assert f'name: "{contract.SCHEDULING_GATE_QUEUE}"' in expression
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert f'"{contract.RESOURCE_GPU}"' in conditions["asks-for-gpus"]
    operators = conditions["not-the-operators"]
    assert f'"{contract.LABEL_MANAGED_BY}"' in operators and f'"{contract.MANAGED_BY_VALUE}"' in operators
    for label in (contract.LABEL_APP, contract.LABEL_TRIALGROUP, contract.LABEL_MODELDEPLOYMENT):
        assert f'"{label}"' in operators


def test_the_scheduler_profile_follows_the_chart_scheduler_name() -> None:
    spec = policies({"scheduler": {"schedulerName": "gpu-share"}})["MutatingAdmissionPolicy"]["spec"]
    condition = next(c for c in spec["matchConditions"] if c["name"] == "a-kube-scheduler-profile")
    assert condition["expression"] == 'object.spec.schedulerName in ["default-scheduler", "gpu-share"]'


def test_off_by_value_or_without_the_operator() -> None:
    assert policies({"queueAdmission": {"enabled": False}}) == {}
    # Nothing would ever take the gate off.
    assert policies({"operator": {"enabled": False}}) == {}
