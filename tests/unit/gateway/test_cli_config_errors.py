"""A bad file given to `tessera gateway`, `tessera loadgen` or `tessera extender`: exit status 2 and one
line on stderr naming the file and the field, as `tessera validate` names a manifest's field; no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tessera.cli import main

TESSERA = Path(sys.executable).parent / "tessera"
MODEL = {
    "name": "m",
    "slo_s": 0.05,
    "workers": ["http://127.0.0.1:9001"],
    "policy": "timeout",
    "mean_solo_s": 0.01,
}


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"models": [{**MODEL, "policy": "fifo"}]}, "models[0].policy: must be one of 'orloj', 'symphony'"),
        ({"models": [MODEL, {**MODEL, "name": "n", "slo": 1}]}, "models[1].slo: unknown field"),
        ({"models": [{**MODEL, "policy": "orloj"}]}, "models[0]: policy orloj needs 'priors'"),
        (
            {
                "pool": {
                    "name": "p",
                    "models": [{"name": "a", "slo_s": 1}],
                    "groups": [{"id": "g", "worker": "http://w", "pp": 0, "models": {"a": [0.1]}}],
                }
            },
            "pool.groups[0].pp: must be >= 1",
        ),
        ({"models": []}, "the gateway needs 'models' or a 'pool'"),
    ],
)
def test_a_bad_gateway_config_names_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, object], field: str
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(config))
    err = _refused(["gateway", "--config", str(path)], capsys)
    assert err.startswith(f"tessera gateway: gateway configuration {path}: {field}"), err


def test_a_gateway_config_that_is_no_mapping_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("- models\n")
    err = _refused(["gateway", "--config", str(path)], capsys)
    assert (
        err == f"tessera gateway: gateway configuration {path}: must be a mapping with 'models' or a 'pool'"
    )


@pytest.mark.parametrize(
    ("payloads", "field"),
    [
        ('[{"inputs": [{"name": "x"}]}, {"id": "a"}]', "[1].inputs: required field is missing"),
        ('{"inputs": []}', "inputs: must have at least 1 item(s)"),
        ('{"inputs": [{"name": "x", "data": [NaN]}]}', "inputs[0].data[0]: nan is not a finite number"),
        ("[]", "must have at least 1 item(s)"),
        ('"x"', "must be a mapping"),
    ],
)
def test_bad_loadgen_payloads_name_their_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payloads: str, field: str
) -> None:
    path = tmp_path / "payloads.json"
    path.write_text(payloads)
    argv = ["loadgen", "--model", "m", "--app", f"a:{path}", "--rate", "1", "--requests", "1"]
    err = _refused(argv, capsys)
    assert err == f"tessera loadgen: request payloads {path}: {field}", err


def test_a_bad_kubeconfig_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latin1 = tmp_path / "kubeconfig"
    latin1.write_bytes("current-context: caf\xe9\n".encode("latin-1"))
    err = _refused(["extender", "--kubeconfig", str(latin1)], capsys)
    assert err == f"tessera extender: cannot use kubeconfig {latin1}: not UTF-8 text (byte 0xe9 at offset 20)"
    two = tmp_path / "two-docs"
    two.write_text("a: 1\n---\nb: 2\n")
    err = _refused(["extender", "--kubeconfig", str(two)], capsys)
    assert err == f"tessera extender: cannot use kubeconfig {two}: holds 2 YAML documents; expected one"


def test_the_gateway_command_refuses_a_bad_config_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps({"models": [{**MODEL, "workers": ["127.0.0.1:9001"]}]}))
    out = subprocess.run(
        [str(TESSERA), "gateway", "--config", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr == (
        f"tessera gateway: gateway configuration {path}: models[0].workers: "
        "worker URL '127.0.0.1:9001' must start with http:// or https://\n"
    ), out.stderr
