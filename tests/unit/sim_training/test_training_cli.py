"""`tessera simulate` end to end on the small example scenario, and its error path."""

import json
from pathlib import Path

import pytest
from tessera.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "scenarios"


def test_simulate_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["simulate", str(EXAMPLES / "training-small.yaml"), "--json", "--seed", "3", "--plots", str(tmp_path)]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["seed"] == 3 and len(out["policies"]) == 5
    assert (tmp_path / "rho_cdf.png").exists() and (tmp_path / "gpu_hours.png").exists()


def test_simulate_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLES / "training-csv.yaml"), "--no-progress"]) == 0
    assert "themis" in capsys.readouterr().out


def test_bad_file_is_reported_with_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: training\npolicies: [themis, nope]\n")
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: policies[1].policy: unknown 'nope'" in err
    bad.write_text("kind: fancy\n")
    assert main(["simulate", str(bad)]) == 2
    assert "kind: unknown kind 'fancy'" in capsys.readouterr().err


def test_metrics_out_writes_the_rho_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.om"
    rc = main(["simulate", str(EXAMPLES / "training-csv.yaml"), "--no-progress", "--metrics-out", str(out)])
    assert rc == 0
    assert f"samples to {out}" in capsys.readouterr().err
    text = out.read_text()
    assert 'tessera_app_gpus{app="' in text and text.rstrip().endswith("# EOF")


def test_bad_shared_themis_knob_names_the_themis_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: training\npolicies: [themis, srsf]\nthemis: {fairness_knob: 1.5}\n")
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: themis: fairness_knob f must be in [0, 1], got 1.5" in err
    bad.write_text("kind: training\npolicies: [{policy: themis, fairness_knob: 2}]\n")
    assert main(["simulate", str(bad)]) == 2
    assert f"{bad}: policies[0]: fairness_knob f must be in [0, 1], got 2" in capsys.readouterr().err
