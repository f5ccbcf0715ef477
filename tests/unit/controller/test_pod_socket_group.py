"""Pods the operator creates join the node agent's socket group, so non-root workloads can reach the
progress and lane sockets (mode 0660, agent.sockets.groupId)."""

from __future__ import annotations

import pytest
from tessera.controller.config import OperatorConfig
from tessera.controller.pods import Owner, PodPlan, build_pod

PLAN = PodPlan(node="n1", gpu_indices=(0,), labels={}, env={}, workload="training", base="a-j1")
OWNER = Owner("App", "a", "ml", "uid-a")
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "x"}]}}


def test_socket_group_added_to_the_templates_own_groups() -> None:
    tmpl = {"spec": {**TEMPLATE["spec"], "securityContext": {"runAsUser": 1000, "supplementalGroups": [5]}}}
    pod = build_pod(tmpl, PLAN, OWNER, "best-effort", socket_group=7070)
    assert pod["spec"]["securityContext"] == {"runAsUser": 1000, "supplementalGroups": [5, 7070]}
    assert tmpl["spec"]["securityContext"]["supplementalGroups"] == [5]  # the template is not changed
    again = build_pod(pod, PLAN, OWNER, "best-effort", socket_group=7070)
    assert again["spec"]["securityContext"]["supplementalGroups"] == [5, 7070]


def test_no_socket_group_leaves_the_security_context_alone() -> None:
    assert "securityContext" not in build_pod(TEMPLATE, PLAN, OWNER, "best-effort")["spec"]


def test_socket_group_must_be_a_group_id() -> None:
    with pytest.raises(ValueError, match="socket_group"):
        OperatorConfig(socket_group=-1)
