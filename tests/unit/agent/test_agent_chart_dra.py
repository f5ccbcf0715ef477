"""The chart's lanes.api: the device plugin by default (no DeviceClass, no DRA grants); dra, the agent's DRA
driver flags and host paths, the DeviceClass the agent's code describes, and the grants the driver uses."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.api import contract
from tessera_agent import cli as agent_cli
from tessera_agent.kubelet.dra_slice import device_class

from tests.unit.chart.chart_render import find, objects, render

DRA = {"lanes": {"api": "dra"}, "agent": {"kubeletRootDir": "/var/lib/k", "cdiDir": "/etc/cdi"}}


def _agent(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    return spec


def _rules(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    role = find(objs, "ClusterRole", "-agent")
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


# The driver reads its Node too (for the slice's owner), with the nodes get every agent has (its taint).
DRA_GRANTS = {
    ("resource.k8s.io", "resourceclaims", "get"),
    ("resource.k8s.io", "resourceslices", "get"),
    ("resource.k8s.io", "resourceslices", "create"),
    ("resource.k8s.io", "resourceslices", "update"),
}


@pytest.mark.parametrize("values", [None, {"lanes": {"api": "auto"}}])
def test_device_plugin_by_default_and_where_auto_finds_no_dra(values: dict[str, Any] | None) -> None:
    # `helm template` knows no cluster: auto falls back to the device plugin
    objs = objects(render(values))
    args = agent_cli.build_parser().parse_args(_agent(objs)["containers"][0]["args"])
    assert args.lanes_api == "devicePlugin"
    assert not [o for o in objs if o["kind"] == "DeviceClass"]
    assert not DRA_GRANTS & _rules(objs)


def test_dra_runs_the_driver_with_the_kubelets_paths_and_its_device_class() -> None:
    objs = objects(render(DRA))
    pod = _agent(objs)
    args = agent_cli.build_parser().parse_args(pod["containers"][0]["args"])
    assert args.lanes_api == "dra"
    assert (str(args.kubelet_plugins_dir), str(args.kubelet_registry_dir), str(args.cdi_dir)) == (
        "/var/lib/k/plugins",
        "/var/lib/k/plugins_registry",
        "/etc/cdi",
    )
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for name, path in [
        ("kubelet-plugins", "/var/lib/k/plugins"),
        ("kubelet-plugins-registry", "/var/lib/k/plugins_registry"),
        ("cdi", "/etc/cdi"),
    ]:
        assert mounts[name] == hosts[name] == path  # same path inside and out
    assert "device-plugins" not in mounts
    dc = find(objs, "DeviceClass")
    want = device_class(contract.RESOURCE_GPU)  # extendedResourceName by default (KEP-5004)
    assert (dc["apiVersion"], dc["metadata"]["name"], dc["spec"]) == (
        want["apiVersion"],
        want["metadata"]["name"],
        want["spec"],
    )
    assert _rules(objs) >= DRA_GRANTS


@pytest.mark.parametrize(("value", "named"), [(None, True), (True, True), (False, False)])
def test_lanes_dra_extended_resource_names_tessera_gpu_in_the_device_class(
    value: bool | None, named: bool
) -> None:
    objs = objects(render({**DRA, "lanes": {"api": "dra", "dra": {"extendedResource": value}}}))
    want = device_class(contract.RESOURCE_GPU if named else None)
    assert find(objs, "DeviceClass")["spec"] == want["spec"]
    assert ("extendedResourceName" in want["spec"]) == named


def test_an_unknown_lanes_api_is_refused() -> None:
    with pytest.raises(Exception, match="lanes"):
        render({"lanes": {"api": "extender"}})


def test_the_be_feedback_loop_runs_with_dra_lanes() -> None:
    """Issue 39: the chart renders the loop's flags with DRA lanes (it failed the render before), and the agent
    takes them as settings."""
    agent = {"lanes": {"hpBe": True, "feedback": {"enabled": True}}, "progress": {"enabled": True}}
    objs = objects(render({**DRA, "agent": {**DRA["agent"], **agent}}))
    argv = ["--node", "n", *_agent(objs)["containers"][0]["args"]]
    s = agent_cli.settings_from(agent_cli.build_parser().parse_args(argv))
    assert s.agent.lanes_api == "dra" and s.agent.be_feedback and s.agent.hp_be_lanes
    # what the loop does on the API server: pods get and delete, events create, beside the claims' get
    assert _rules(objs) >= DRA_GRANTS | {
        ("", "pods", "get"),
        ("", "pods", "delete"),
        ("", "events", "create"),
    }


def test_hp_be_lanes_reach_the_dra_driver() -> None:
    objs = objects(render({**DRA, "agent": {**DRA["agent"], "lanes": {"hpBe": True}}}))
    (container,) = _agent(objs)["containers"]
    assert {"--lanes-api=dra", "--hp-be-lanes"} <= set(container["args"])
    # a DRA lane's class is its claim's LaneConfig: the agent refuses the pods' priority classes there (the
    # scheduler extender, still rendered, takes them)
    assert not [a for a in container["args"] if a.startswith("--hp-priority-class")]
    argv = ["--node", "n", *container["args"]]
    assert agent_cli.settings_from(agent_cli.build_parser().parse_args(argv)).agent.hp_be_lanes


@pytest.mark.parametrize("effect", [None, "NoExecute"])
def test_the_unhealthy_taint_effect_reaches_the_agents_settings(effect: str | None) -> None:
    values: dict[str, Any] = {"lanes": {"api": "dra"}}
    if effect:
        values["agent"] = {"dra": {"unhealthyTaintEffect": effect}}
    argv = _agent(objects(render(values)))["containers"][0]["args"]
    args = agent_cli.build_parser().parse_args([*argv, "--node", "gpu-node-1"])  # NODE_NAME in the pod
    assert agent_cli.settings_from(args).agent.dra_unhealthy_effect == (effect or "NoSchedule")
