"""Chart value gpuNodes.reserve: GPU nodes kept for the pods tessera-scheduler places (docs/operations.md,
"Reserving GPU nodes"). Rendered by the real Helm engine; the policy itself runs on the real API server in
tests/integration/k8s/test_gpu_nodes_policy.py."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
from tessera.api import contract

from .chart_render import NAMESPACE, find, objects, render

RESERVE = {"gpuNodes": {"reserve": True}}
POLICY_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def agent_pod(values: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = find(objects(render(values)), "DaemonSet", "-agent")["spec"]["template"]["spec"]
    return spec


def policies(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The routing policy and binding (the queue's admission policy, another component, left out)."""
    return {
        o["kind"]: o
        for o in objects(render(values))
        if o["kind"] in POLICY_KINDS and o["metadata"]["labels"]["app.kubernetes.io/component"] == "gpu-nodes"
    }


def test_off_by_default_the_agent_clears_the_taint_and_nothing_is_routed() -> None:
    pod = agent_pod(None)
    # Without --reserve-node the agent removes the taint: turning the value off undoes it.
    assert "--reserve-node" not in pod["containers"][0]["args"]
    assert policies(None) == {}


def test_on_the_agent_taints_its_node_and_tolerates_the_taint() -> None:
    for values in (None, RESERVE, {"gpuNodes": {"reserve": True}, "agent": {"tolerations": []}}):
        pod = agent_pod(values)
        # Always: an agent restarted on its reserved node must come back, whatever agent.tolerations says.
        assert contract.gpu_node_toleration() in pod["tolerations"]
    assert "--reserve-node" in agent_pod(RESERVE)["containers"][0]["args"]
    # The user's tolerations stay beside it.
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in agent_pod(RESERVE)[
        "tolerations"
    ]


def test_the_policy_routes_the_labelled_namespaces_to_the_chart_scheduler() -> None:
    values = {
        "gpuNodes": {"reserve": True, "namespaceLabel": {"key": "example.com/team", "value": "ml"}},
        "scheduler": {"schedulerName": "gpu-share"},
    }
    got = policies(values)
    policy, binding = got["MutatingAdmissionPolicy"], got["MutatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    (mutation,) = spec["mutations"]
    expression = mutation["jsonPatch"]["expression"]
    assert 'value: "gpu-share"' in expression  # scheduler.schedulerName, not a fixed name
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {
        "matchLabels": {"example.com/team": "ml"},
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
        ],
    }
    # The default: the namespace label the docs name.
    default = policies(RESERVE)["MutatingAdmissionPolicyBinding"]["spec"]["matchResources"]
    assert default["namespaceSelector"]["matchLabels"] == {contract.LABEL_GPU_NODES_NAMESPACE: "true"}


def test_the_policy_adds_the_toleration_the_agent_taint_needs() -> None:
    expression = policies(RESERVE)["MutatingAdmissionPolicy"]["spec"]["mutations"][0]["jsonPatch"][
        "expression"
    ]
    (literal,) = re.findall(r"Object\.spec\.tolerations\{(.*?)\}", expression, re.S)
    fields = dict(re.findall(r'(\w+): "([^"]*)"', literal))
    assert fields == contract.gpu_node_toleration()


def test_admission_policy_off_keeps_the_taint_without_routing() -> None:
    values = {"gpuNodes": {"reserve": True, "admissionPolicy": False}}
    assert policies(values) == {}
    assert "--reserve-node" in agent_pod(values)["containers"][0]["args"]


def test_reserve_without_the_agent_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"gpuNodes\.reserve: the agents taint the GPU nodes"):
        render({"gpuNodes": {"reserve": True}, "agent": {"enabled": False}})


def test_notes_say_how_to_route_a_namespace() -> None:
    notes = render(RESERVE)["tessera/templates/NOTES.txt"]
    assert f"kubectl label namespace <namespace> {contract.LABEL_GPU_NODES_NAMESPACE}=true" in notes
    manual = render({"gpuNodes": {"reserve": True, "admissionPolicy": False}})["tessera/templates/NOTES.txt"]
    assert "spec.schedulerName: tessera-scheduler and the toleration" in manual
    assert "GPU nodes are reserved" not in render(None)["tessera/templates/NOTES.txt"]
