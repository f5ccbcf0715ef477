"""The agent DaemonSet's HP/BE lane settings: off by default with no extra RBAC; on, the arguments the
agent's own parser reads back, and the BE feedback loop's grants (pods get/delete, events create) when the
loop is on (delete and events come with the lane audit too)."""

from __future__ import annotations

from typing import Any

import pytest
from tessera_agent import cli as agent_cli

from tests.unit.chart.chart_render import find, objects, render

FEEDBACK = {
    "agent": {
        "lanes": {
            "hpBe": True,
            "hpPriorityClasses": ["inference-high", "latency-critical"],
            "bePercent": 40,
            "feedback": {
                "enabled": True,
                "epsilon": 0.2,
                "minIntervalSeconds": 600,
                "hysteresis": 3,
                "stepIntervalSeconds": 15,
            },
        }
    }
}


def _args(objs: list[dict[str, Any]]) -> Any:
    pod = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    return agent_cli.build_parser().parse_args(pod["containers"][0]["args"])


def _agent_rules(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    role = find(objs, "ClusterRole", "-agent")
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_lanes_off_by_default_and_no_get_grant() -> None:
    """With the loop off only the lane audit (on by default) deletes pods: delete and events, never get."""
    objs = objects(render())
    args = _args(objs)
    assert not args.hp_be_lanes and not args.be_feedback
    rules = _agent_rules(objs)
    assert ("", "pods", "get") not in rules
    audit_off = _agent_rules(objects(render({"agent": {"laneAudit": {"enabled": False}}})))
    assert ("", "pods", "delete") not in audit_off and ("", "events", "create") not in audit_off


def test_feedback_on_passes_its_settings_and_grants_delete_and_events() -> None:
    objs = objects(render(FEEDBACK))
    args = _args(objs)
    assert args.hp_be_lanes and args.be_feedback and args.be_percent == 40
    assert args.hp_priority_class == ["inference-high", "latency-critical"]
    assert (args.be_epsilon, args.be_min_interval, args.be_hysteresis, args.be_step_interval) == (
        0.2,
        600,
        3,
        15,
    )
    assert str(args.progress_socket).endswith("progress.sock")  # the loop's latency signal
    assert {("", "pods", "get"), ("", "pods", "delete"), ("", "events", "create")} <= _agent_rules(objs)


def test_feedback_without_lanes_is_refused_at_render() -> None:
    values = {"agent": {"lanes": {**FEEDBACK["agent"]["lanes"], "hpBe": False}}}
    with pytest.raises(Exception, match=r"needs agent\.lanes\.hpBe"):
        render(values)


@pytest.mark.parametrize("values", [None, FEEDBACK], ids=["default", "lanes-on"])
def test_extender_gets_the_agents_hp_priority_classes(values: dict[str, Any] | None) -> None:
    from tessera import cli

    objs = objects(render(values))
    pod = find(objs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    (ext,) = [c for c in pod["containers"] if c["name"] == "extender"]
    ext_args = cli.build_parser().parse_args(ext["args"])
    want = (values or {"agent": {"lanes": {"hpPriorityClasses": ["latency-critical"]}}})["agent"]["lanes"]
    assert ext_args.hp_priority_class == want["hpPriorityClasses"]
    if values is not None:  # the agent reads them only with HP/BE lanes on
        assert _args(objs).hp_priority_class == ext_args.hp_priority_class
