"""Container args and RBAC of the rendered chart checked against the code they configure.

Every Tessera container's command line is parsed by the real argparse parser of the program it starts
(`tessera` from tessera.cli.build_parser, `tessera-agent` from tessera_agent.cli.build_parser), so a flag
the chart passes can never drift from what the program accepts. The scheduler's KubeSchedulerConfiguration
keeps the extender settings of deploy/scheduler/kube-scheduler-config.yaml, and the operator's ClusterRole
and Role equal tessera.controller.rbac.operator_rbac for either watch mode (tests/integration/k8s/test_rbac.py
checks those against a real API server's audit log of the operator's requests).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
from typing import Any

import pytest
import yaml
from tessera import cli
from tessera.controller.rbac import operator_rbac
from tessera_agent import cli as agent_cli

from .chart_render import NAMESPACE, ROOT, find, objects, render
from .test_chart import VALUE_SETS

# The operator's shell wrapper draws a random peering priority; any integer stands in for it.
SHUF = '"$(shuf -i 1-1000000000 -n 1)"'


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{parser.prog} rejects the chart's args {argv}: {err.getvalue().strip()}")


def _containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                out[f"{obj['metadata']['name']}/{c['name']}"] = c
    return out


def _operator_argv(container: dict[str, Any]) -> list[str]:
    assert container["command"] == ["/bin/sh", "-c"]
    (script,) = container["args"]
    assert SHUF in script, "the operator's peering priority is no longer drawn at start"
    argv = shlex.split(script.replace(SHUF, "7"))
    assert argv[:2] == ["exec", "tessera"], argv
    return argv[2:]


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_container_command_line_parses_with_the_real_parser(values: str) -> None:
    containers = _containers(objects(render(VALUE_SETS[values])))
    seen = set()
    for where, c in containers.items():
        if c["name"] == "operator":
            args = _parse(cli.build_parser(), _operator_argv(c))
            assert args.func.__module__ == "tessera.commands.operator", where
            assert args.metrics_port == c["ports"][0]["containerPort"]
            assert args.liveness.endswith(f":{c['ports'][1]['containerPort']}/healthz")
            assert args.priority == 7
            # The Themis settings reach the operator as the values give them (defaults when unset).
            themis = {"leaseSeconds": 600, "fairnessKnob": 0.8, "starvingRank": "fair_share"}
            themis |= ((VALUE_SETS[values] or {}).get("operator") or {}).get("themis", {})
            assert (args.lease_seconds, args.fairness_knob, args.starving_rank) == (
                themis["leaseSeconds"],
                themis["fairnessKnob"],
                themis["starvingRank"],
            )
            assert args.admission_threshold == themis.get("admissionThreshold")
            # Pods the operator creates join the group the agent's sockets belong to.
            sockets = ((VALUE_SETS[values] or {}).get("agent") or {}).get("sockets") or {}
            assert args.socket_group == sockets.get("groupId", 7070)
        elif c["name"] == "extender":
            assert c["command"] == ["tessera"]
            args = _parse(cli.build_parser(), c["args"])
            assert args.func.__module__ == "tessera.commands.extender", where
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert args.metrics_port == ports["metrics"]
            # The verbs' port is declared only where it is reachable off loopback (TLS).
            assert ports.get("extender", args.port) == args.port
            assert args.host == "127.0.0.1" or args.tls_client_ca_file is not None
        elif c["name"] == "agent":
            assert c["command"] == ["tessera-agent"]
            args = _parse(agent_cli.build_parser(), c["args"])
            assert args.metrics_port == c["ports"][0]["containerPort"]
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert str(args.mps_root) in mounts and str(args.device_plugin_dir) in mounts
            if args.progress_socket is not None:
                assert str(args.progress_socket.parent) in mounts
            assert args.reserve_node == bool(
                ((VALUE_SETS[values] or {}).get("gpuNodes") or {}).get("reserve")
            )
        elif c["name"] == "kube-scheduler":
            continue
        else:
            pytest.fail(f"{where}: no parser known for container {c['name']!r}")
        seen.add(c["name"])
    expected = {
        "default": {"operator", "extender", "agent"},
        "non-default": {"operator", "extender", "agent"},
        "queues": {"operator", "extender", "agent"},
        "gpu-nodes": {"operator", "extender", "agent"},
        "agent-only": {"agent"},
    }[values]
    assert seen == expected


def test_operator_namespace_and_extra_args_reach_the_parser() -> None:
    values = {"operator": {"allNamespaces": False, "extraArgs": ["--lease-seconds", "300"]}}
    c = _containers(objects(render(values)))["tessera-operator/operator"]
    args = _parse(cli.build_parser(), _operator_argv(c))
    assert args.namespace == ["tessera-system"] and args.lease_seconds == 300


def test_agent_progress_socket_is_on_by_default_with_its_host_mount() -> None:
    objs = objects(render())
    pod = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    args = _parse(agent_cli.build_parser(), pod["containers"][0]["args"])
    assert str(args.progress_socket) == "/run/tessera/progress/progress.sock"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["progress"]["hostPath"]["path"] == "/run/tessera/progress"

    off = objects(render({"agent": {"progress": {"enabled": False, "hostDir": "/run/tessera/progress"}}}))
    pod = find(off, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    assert _parse(agent_cli.build_parser(), pod["containers"][0]["args"]).progress_socket is None
    assert "progress" not in {v["name"] for v in pod["volumes"]}


def test_scheduler_config_matches_the_reference_config() -> None:
    reference = yaml.safe_load((ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    config = yaml.safe_load(find(objects(render()), "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    assert (config["apiVersion"], config["kind"]) == (reference["apiVersion"], reference["kind"])
    assert config["profiles"] == reference["profiles"]
    (ref,) = reference["extenders"]
    (ext,) = config["extenders"]
    # Weight and leader election are deployment choices (values); everything else is the extender contract.
    for key in ("urlPrefix", "filterVerb", "prioritizeVerb", "bindVerb", "nodeCacheCapable", "httpTimeout",
                "ignorable"):  # fmt: skip
        assert ext[key] == ref[key], key
    assert ext.get("managedResources") == ref.get("managedResources")
    assert config["percentageOfNodesToScore"] == reference["percentageOfNodesToScore"]
    assert ext["weight"] > 0


def _triples(rules: list[dict[str, list[str]]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.mark.parametrize("lanes_api", ["devicePlugin", "dra"])
@pytest.mark.parametrize("all_namespaces", [True, False])
def test_operator_roles_equal_the_rules_the_operator_needs(all_namespaces: bool, lanes_api: str) -> None:
    objs = objects(render({"operator": {"allNamespaces": all_namespaces}, "lanes": {"api": lanes_api}}))
    want = operator_rbac(clusterwide=all_namespaces, lanes_api=lanes_api)
    argv = _operator_argv(_containers(objs)["tessera-operator/operator"])
    assert _parse(cli.build_parser(), argv).lanes_api == lanes_api
    assert _triples(find(objs, "ClusterRole", "-operator")["rules"]) == _triples(
        [r.to_k8s() for r in want.cluster]
    )
    roles = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-operator")]
    bindings = [o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"].endswith("-operator")]
    if all_namespaces:
        assert not roles and not bindings  # nothing namespaced widens the ClusterRole
    else:
        # Namespaced work is granted in the release namespace only, the one the operator is told to serve.
        (role,), (binding,) = roles, bindings
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
        assert _triples(role["rules"]) == _triples([r.to_k8s() for r in want.namespaced])
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        c = _containers(objs)["tessera-operator/operator"]
        assert _parse(cli.build_parser(), _operator_argv(c)).namespace == [NAMESPACE]
    sa = find(objs, "ServiceAccount", "-operator")["metadata"]
    for binding in [find(objs, "ClusterRoleBinding", "-operator"), *bindings]:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
        ]


@pytest.mark.parametrize("lanes_api", ["devicePlugin", "dra"])
def test_with_dra_lanes_the_extender_reads_claims_under_a_grant_of_its_own(lanes_api: str) -> None:
    """`lanes.api: dra`: the extender runs with --dra-claims (pods asking through ResourceClaims are scored by
    the packing rule) and its ClusterRole reads resourceclaims; the device plugin's path renders neither."""
    objs = objects(render({"lanes": {"api": lanes_api}}))
    (ext,) = [c for c in _containers(objs).values() if c["name"] == "extender"]
    args = _parse(cli.build_parser(), ext["args"])
    assert args.dra_claims == (lanes_api == "dra")
    role = find(objs, "ClusterRole", "-extender")
    claims = [r for r in role["rules"] if "resourceclaims" in r["resources"]]
    if lanes_api == "dra":
        assert claims == [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims"],
                "verbs": ["get", "list", "watch"],
            }
        ]
    else:
        assert claims == []
