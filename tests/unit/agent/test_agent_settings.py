"""`tessera-agent`'s settings and the file it reads (`--fake-pods`) are pydantic models: every kind of bad input
is one line on stderr naming the flag or the file and the field path, with exit code 2 and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from tessera.api import contract
from tessera.api.resources import input_errors
from tessera.api.safe_load import InputError
from tessera_agent import cli
from tessera_agent.config import AgentConfig, AgentSettings
from tessera_agent.pods import load_pod_manifests

from tests.unit.chart.chart_render import find, objects, render


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """stderr of a run that must be refused with exit code 2 before anything starts."""
    assert cli.main(["--node", "n", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera-agent: ") and err.count("\n") == 1 and "Traceback" not in err
    return err.removeprefix("tessera-agent: ").strip()


def _pods_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pods.json"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_flags_defaults() -> None:
    """Every flag fills a settings field, and no flag given means the models' own defaults."""
    args = cli.build_parser().parse_args(["--node", "n"])
    assert cli.settings_from(args) == AgentSettings(agent=AgentConfig(node_name="n"))
    assert AgentConfig(node_name="n").hp_priority_classes == (contract.CLASS_LATENCY_CRITICAL,)


def test_flags_fill_their_fields() -> None:
    argv = [
        "--node",
        "n",
        "--no-mps",
        "--declared-only",
        "--dev-root",
        "/fake/dev",
        "--no-peer-check",
        "--be-min-interval",
        "60",
        "--shutdown-timeout",
        "3",
        "--reserve-node",
        "--no-lane-audit",
        "--lane-audit-interval",
        "2.5",
        "--on-lane-mismatch",
        "report",
        "--pod-resources-socket",
        "/k/pod-resources/kubelet.sock",
    ]
    argv += ["--hp-priority-class", "a", "--hp-priority-class", "b", "--lane-policy", "SRTF"]
    s = cli.settings_from(cli.build_parser().parse_args(argv))
    assert not s.mps and s.declared_only and str(s.agent.dev_root) == "/fake/dev"
    assert not s.agent.peer_check and s.agent.be_min_interval_s == 60
    assert s.shutdown_timeout_s == 3 and s.agent.hp_priority_classes == ("a", "b") and s.lane_policy == "SRTF"
    assert s.agent.reserve_node
    assert (
        not s.agent.lane_audit
        and s.agent.lane_audit_interval_s == 2.5
        and s.agent.on_lane_mismatch == "report"
    )
    assert str(s.agent.pod_resources_socket) == "/k/pod-resources/kubelet.sock"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-mps"], "--no-mps (mps): without MPS nothing enforces a lane's memory and compute limits"),
        (["--be-percent", "0"], "--be-percent (agent.be_percent): must be >= 1"),
        (["--slots-per-gpu", "49"], "--slots-per-gpu (agent.slots_per_gpu): must be <= 48"),
        (["--socket-group", str(2**32 - 1)], "--socket-group (agent.socket_group): must be <= 4294967294"),
        (["--metrics-port", "65536"], "--metrics-port (metrics_port): must be <= 65535"),
        (["--shutdown-timeout", "0"], "--shutdown-timeout (shutdown_timeout_s): must be > 0"),
        (["--be-epsilon", "nan"], "--be-epsilon (agent.be_epsilon): must be a finite number"),
        (["--fake-gpus", "-1"], "--fake-gpus (fake_gpus): must be >= 0"),
        (
            ["--fake-gpus", "1", "--fake-gpu-backend", "1"],
            "--fake-gpu-backend (fake_gpu_backend): --fake-gpus runs without a Kubernetes API",
        ),
        (
            ["--fake-gpus", "1", "--lanes-api", "dra"],
            "--fake-gpus (fake_gpus): DRA lanes read claims from the Kubernetes API",
        ),
        (  # auto may choose DRA lanes: refused where they would be, before the API server is asked
            ["--fake-gpus", "1", "--lanes-api", "auto"],
            "--fake-gpus (fake_gpus): DRA lanes read claims from the Kubernetes API",
        ),
        (
            ["--fake-gpus", "1", "--reserve-node"],
            "--fake-gpus (fake_gpus): --reserve-node taints the Node through the Kubernetes API",
        ),
        (
            ["--kubelet-plugins-dir", "/" + "p" * 100],
            "--kubelet-plugins-dir (agent.kubelet_plugins_dir): a unix socket path must be at most 107 bytes",
        ),
        (["--extra-reserve-mib", "-5"], "--extra-reserve-mib (agent.extra_reserve_mib): must be >= 0"),
        (
            ["--coordinator-socket", "/" + "a" * 110],
            "--coordinator-socket (agent.coordinator_socket): a unix socket path must be at most 107 bytes",
        ),
        (
            ["--device-plugin-dir", "/" + "d" * 100],
            "--device-plugin-dir (agent.device_plugin_dir): a unix socket path must be at most 107 bytes",
        ),
    ],
)
def test_out_of_range_flag_names_flag_and_field(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert _refused(capsys, *argv).startswith(message)


@pytest.mark.parametrize("api", ["dra", "auto"])
def test_dra_lanes_take_the_be_feedback_loop(api: str) -> None:
    """Issue 39: the loop runs with DRA lanes too (kubelet/dra_feedback.py); what DRA lanes still cannot do
    is refused (fake GPUs: test_out_of_range_flag_names_flag_and_field)."""
    argv = [
        "--node",
        "n",
        "--lanes-api",
        api,
        "--hp-be-lanes",
        "--be-feedback",
        "--progress-socket",
        "/p.sock",
    ]
    s = cli.settings_from(cli.build_parser().parse_args(argv))
    assert s.agent.lanes_api == api and s.agent.be_feedback and s.agent.hp_be_lanes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--device-plugin-dir", "/dp"],
            "--device-plugin-dir (agent.device_plugin_dir): not with DRA lanes: ",
        ),
        (
            ["--hp-be-lanes", "--hp-priority-class", "urgent"],
            "--hp-priority-class (agent.hp_priority_classes): not with DRA lanes: with DRA lanes a lane's class "
            "is its claim's LaneConfig",
        ),
        (
            ["--on-lane-mismatch", "report"],
            "--on-lane-mismatch (agent.on_lane_mismatch): not with DRA lanes: ",
        ),
        (["--lane-audit-interval", "5"], "--lane-audit-interval (agent.lane_audit_interval_s): not with DRA"),
        (
            ["--pod-resources-socket", "/p.sock"],
            "--pod-resources-socket (agent.pod_resources_socket): not with",
        ),
    ],
)
def test_device_plugin_options_are_refused_with_dra_lanes_never_ignored(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Issue 39: an option a mode cannot honour is refused at start. With auto either path may run, so each
    path's options are taken; without --lanes-api dra the same flags are the device plugin's own."""
    assert _refused(capsys, "--lanes-api", "dra", *argv).startswith(message)
    for api in ("auto", "devicePlugin"):
        cli.settings_from(cli.build_parser().parse_args(["--node", "n", "--lanes-api", api, *argv]))


def test_dra_lanes_take_what_asks_nothing_of_the_device_plugin() -> None:
    """Turning the lane audit off, and every option's default, ask nothing of the device plugin."""
    for argv in ([], ["--no-lane-audit"]):
        args = cli.build_parser().parse_args(["--node", "n", "--lanes-api", "dra", *argv])
        s = cli.settings_from(args)
        assert s.agent.lanes_api == "dra" and s.agent.lane_audit is not bool(argv)
    with pytest.raises(ValueError, match="not with DRA lanes: the lane audit"):
        AgentConfig(node_name="n", lanes_api="dra", lane_audit=True)


def test_every_refused_flag_is_on_the_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, "--be-hysteresis", "101", "--sample-interval", "-1")
    assert "--be-hysteresis (agent.be_hysteresis): must be <= 100" in err
    assert "--sample-interval (sample_interval_s): must be > 0" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--be-feedback"], "--be-feedback (agent.be_feedback): the BE feedback loop needs HP/BE lanes"),
        (
            ["--hp-be-lanes", "--be-feedback"],
            "--be-feedback (agent.be_feedback): the BE feedback loop reads HP iteration times",
        ),
        (["--fake-pods", "/tmp/p.json"], "--fake-pods (fake_pods): fake pods need fake GPUs"),
    ],
)
def test_flags_that_need_another_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert _refused(capsys, *argv).startswith(message)


def test_missing_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--node", ""]) == 2
    assert "--node (agent.node_name): the node name is required" in capsys.readouterr().err


def test_wrong_type_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--node", "n", "--slots-per-gpu", "four"])
    assert exit_.value.code == 2
    assert "--slots-per-gpu: invalid int value: 'four'" in capsys.readouterr().err


def test_unknown_field_is_named_with_its_path() -> None:
    with pytest.raises(ValidationError) as err:
        AgentSettings.model_validate({"agent": {"node_name": "n", "slot_per_gpu": 4}, "metrics_prot": 1})
    assert input_errors(err.value) == [
        ("agent.slot_per_gpu", "unknown field"),
        ("metrics_prot", "unknown field"),
    ]


FAKE = ["--fake-gpus", "1", "--fake-pods"]


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ('[{"metadata": {"uid": "u1"}}]', "[0].metadata.name", "required field is missing"),  # missing
        (  # wrong type
            '[{"metadata": {"name": "a", "uid": "u1", "annotations": {"tessera.io/workload": 3}}}]',
            '[0].metadata.annotations["tessera.io/workload"]',
            "must be a string",
        ),
        (
            '[{"metadata": {"name": "a", "uid": ""}}]',
            "[0].metadata.uid",
            "must be at least 1 character",
        ),  # range
        ('{"metadata": {}}', "", "must be a list"),  # the whole file: no field to name
        (
            '[{"metadata": {"name": "a", "uid": "u"}, "spec": {"containers": 1}}]',
            "[0].spec.containers",
            "must be a list",
        ),
        (
            '[{"metadata": {"name": "a", "uid": "u"}, "status": {"phase": NaN}}]',
            "[0].status.phase",
            "nan is not a finite number",
        ),
    ],
)
def test_bad_fake_pods_name_file_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, field: str, problem: str
) -> None:
    path = _pods_file(tmp_path, text)
    where = f"{field}: " if field else ""
    assert _refused(capsys, *FAKE, path).startswith(f"--fake-pods {path}: {where}{problem}")


def test_fake_pods_not_json_or_unreadable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _pods_file(tmp_path, '[{"metadata": ')
    assert _refused(capsys, *FAKE, path).startswith(f"--fake-pods {path}: not valid JSON: Expecting value")
    missing = str(tmp_path / "nope.json")
    assert (
        _refused(capsys, *FAKE, missing) == f"--fake-pods {missing}: cannot read: No such file or directory"
    )
    (tmp_path / "latin1.json").write_bytes(b'["\xe9"]')
    assert "not UTF-8 text (byte 0xe9" in _refused(capsys, *FAKE, str(tmp_path / "latin1.json"))


def test_fake_pods_with_more_bad_entries_say_how_many(tmp_path: Path) -> None:
    path = Path(_pods_file(tmp_path, json.dumps([{"metadata": {}}, {"metadata": {}}])))
    with pytest.raises(
        InputError, match=r"\[0\]\.metadata\.name: required field is missing \(and 3 more problem\(s\)\)"
    ):
        load_pod_manifests(path)


def test_a_pod_copied_from_a_cluster_is_read_whole(tmp_path: Path) -> None:
    """The fields Kubernetes owns and the agent does not read are let through."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "a", "namespace": "ml", "uid": "u1", "labels": {"app": "x"}},
        "spec": {
            "nodeName": "n",
            "priorityClassName": "latency-critical",
            "containers": [
                {"name": "c", "image": "i", "resources": {"limits": {contract.RESOURCE_GPU: "2"}}}
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }
    (info,) = load_pod_manifests(Path(_pods_file(tmp_path, json.dumps([pod]))))
    assert (info.key, info.uid, info.gpu_requests, info.priority_class, info.phase) == (
        "ml/a",
        "u1",
        (2,),
        "latency-critical",
        "Running",
    )


def test_a_process_prints_one_line_and_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tessera_agent.cli", "--node", "n", "--be-percent", "101"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "tessera-agent: --be-percent (agent.be_percent): must be <= 100\n"


@pytest.mark.parametrize("lanes", [False, True])
def test_the_charts_arguments_are_valid_settings(lanes: bool) -> None:
    feedback = {
        "enabled": True,
        "epsilon": 0.2,
        "minIntervalSeconds": 600,
        "hysteresis": 3,
        "stepIntervalSeconds": 15,
    }
    values = {"agent": {"lanes": {"hpBe": True, "bePercent": 40, "feedback": feedback}}} if lanes else None
    pod = find(objects(render(values)), "DaemonSet", "-agent")["spec"]["template"]["spec"]
    args = cli.build_parser().parse_args(["--node", "n", *pod["containers"][0]["args"]])
    s = cli.settings_from(args)
    assert s.agent.slots_per_gpu == contract.DEFAULT_SLOTS_PER_GPU and s.agent.socket_group == 7070
    assert s.agent.be_feedback is lanes and (s.agent.be_percent == 40 if lanes else 50)
