"""The agent DaemonSet's node-socket settings (issue 19): the sockets' group, the coordinator socket and its
host mount, and a shutdown bound the pod's grace period covers, parsed by the agent's own argument parser."""

from __future__ import annotations

from typing import Any

from tessera_agent import cli as agent_cli

from tests.unit.chart.chart_render import find, objects, render


def _agent(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    pod = find(objects(render(values)), "DaemonSet", "-agent")["spec"]["template"]["spec"]
    return pod, agent_cli.build_parser().parse_args(pod["containers"][0]["args"])


def test_sockets_group_and_shutdown_bound_by_default() -> None:
    pod, args = _agent()
    assert args.socket_group == 7070 and not args.no_peer_check
    assert args.coordinator_socket is None  # opt-in
    assert pod["hostPID"] is True  # peers' PIDs must be visible to map them to pods
    assert pod["terminationGracePeriodSeconds"] == args.shutdown_timeout + 5 == 15


def test_coordinator_socket_is_mounted_from_its_host_dir() -> None:
    pod, args = _agent(
        {
            "agent": {
                "coordinator": {"enabled": True, "hostDir": "/run/tessera/lanes"},
                "sockets": {"groupId": 4000},
                "shutdownTimeoutSeconds": 20,
            }
        }
    )
    assert str(args.coordinator_socket) == "/run/tessera/lanes/coordinator.sock"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["coordinator"] == volumes["coordinator"]["hostPath"]["path"] == "/run/tessera/lanes"
    assert args.socket_group == 4000 and args.shutdown_timeout == 20
    assert pod["terminationGracePeriodSeconds"] == 25


def test_group_zero_leaves_the_sockets_root_only() -> None:
    _, args = _agent({"agent": {"sockets": {"groupId": 0}}})
    assert args.socket_group == 0
