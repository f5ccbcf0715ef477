"""Bad files and flags given to `tessera validate` and `tessera simulate`: one clear line, never a traceback,
never a run that does not end. Each case was a traceback, a hang or an accepted value before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tessera.api.safe_load import MAX_DEPTH, InputError, load_yaml_file, value_problems
from tessera.cli import main
from tessera.commands.simulate import load_scenario
from tessera.sim.scenario import MAX_APPS, MAX_GPUS, MAX_TRIALS, ScenarioError

ROOT = Path(__file__).parents[3]
APP = ROOT / "examples" / "app.yaml"
TESSERA = Path(sys.executable).parent / "tessera"


def _app_with(tmp_path: Path, old: str, new: str) -> Path:
    text = APP.read_text()
    assert old in text
    path = tmp_path / "app.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_a_non_utf8_file_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("kind: App\nmetadata: {name: caf\xe9}\n".encode("latin-1"))
    assert main(["validate", str(bad)]) == 1
    assert capsys.readouterr().out == f"{bad}: not UTF-8 text (byte 0xe9 at offset 30)\n"
    assert main(["simulate", str(bad)]) == 2
    assert capsys.readouterr().err == f"error: {bad}: file: not UTF-8 text (byte 0xe9 at offset 30)\n"


def test_deeply_nested_yaml_is_refused_without_recursion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("a: " + "[" * 900 + "]" * 900 + "\n")
    block = tmp_path / "block.yaml"
    block.write_text("".join(" " * i + f"k{i}:\n" for i in range(2000)))
    for deep in (flow, block):
        assert main(["validate", str(deep)]) == 1
        assert capsys.readouterr().out == f"{deep}: nested more than {MAX_DEPTH} levels deep\n"
        assert main(["simulate", str(deep)]) == 2
        assert capsys.readouterr().err == f"error: {deep}: file: nested more than {MAX_DEPTH} levels deep\n"


def test_a_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" * 100)
    with pytest.raises(InputError, match="larger than 64 bytes"):
        load_yaml_file(big, max_bytes=64)


@pytest.mark.parametrize(
    ("old", "new", "field", "why"),
    [
        ("  maxGPUs: 8\n", "  maxGPUs: 1e40\n", "spec.maxGPUs", "must be an integer"),
        ("  maxGPUs: 8\n", "  maxGPUs: 100000000000000000000000\n", "spec.maxGPUs", "does not fit in a 64-bit"),
        ("  maxGPUs: 8\n", "  maxGPUs: 5000\n", "spec.maxGPUs", "must be <= 4096"),
        ("  maxGPUs: 8\n", "  maxGPUs: .inf\n", "spec.maxGPUs", "inf is not a finite number"),
        ("budgetGPUSeconds: 172800", "budgetGPUSeconds: .nan", "spec.tuning.successiveHalving.budgetGPUSeconds",
         "nan is not a finite number"),
        ("checkpointSeconds: 8", "checkpointSeconds: 1.0e+300", "spec.jobs[3].checkpointSeconds", "must be <= 315360000"),
    ],
)  # fmt: skip
def test_validate_refuses_nan_inf_and_oversized_numbers_at_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, field: str, why: str
) -> None:
    path = _app_with(tmp_path, old, new)
    assert main(["validate", str(path)]) == 1
    skipped, line = capsys.readouterr().out.splitlines()  # the example's Namespace, then the App
    assert skipped.startswith(f"SKIP {path} (Namespace/research)")
    assert line.startswith(f"{path}: App/resnet50-lr-search: {field}: ") and why in line, line


def test_value_problems_name_the_path_and_visit_shared_nodes_once() -> None:
    data = yaml.safe_load("a: &x [1, .nan, {b: .inf}]\nc: [*x, *x, *x]\n")
    assert list(value_problems(data)) == [
        ("a[1]", "nan is not a finite number"),
        ("a[2].b", "inf is not a finite number"),
    ]
    bomb = "a: &a [x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}]\n" for p, c in zip("abcdefghijklmnop", "bcdefghijklmnopq", strict=True)
    )
    assert list(value_problems(yaml.safe_load(bomb))) == []  # 2^17 leaves, 17 distinct lists


def test_a_key_with_a_newline_is_quoted_so_the_error_stays_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found by the fuzzer: a complex YAML key ("\n") holding an integer past int64 under apiVersion.
    bad = "apiVersion:\n  ? '\n\n    '\n  : 9223372036854775808\n"
    assert list(value_problems(yaml.safe_load(bad))) == [
        ('apiVersion["\\n"]', "9223372036854775808 does not fit in a 64-bit integer")
    ]
    path = _app_with(tmp_path, "apiVersion: tessera.io/v1alpha1\n", bad)
    assert main(["validate", str(path)]) == 1
    skipped, line = capsys.readouterr().out.splitlines()
    assert skipped.startswith(f"SKIP {path} (Namespace/research)")
    assert (
        line
        == f'{path}: App/resnet50-lr-search: apiVersion["\\n"]: 9223372036854775808 does not fit in a 64-bit integer'
    )


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        ("kind: training\ntrace: {generate: {apps: 5, mean_interarrival_s: .nan}}\n",
         "trace.generate.mean_interarrival_s", "nan is not a finite number"),
        ("kind: training\nlease_s: .inf\n", "lease_s", "inf is not a finite number"),
        ("kind: training\npolicies: [{policy: tiresias, lease_s: 1.0e+30}]\n", "policies[0].lease_s", "the most a scenario accepts"),
        ("kind: training\npolicies: [{policy: tiresias, lease_s: soon}]\n", "policies[0].lease_s", "must be a number"),
        ("kind: training\ntrace: {generate: {apps: 1000000000000}}\n", "trace.generate.apps", f"more than {MAX_APPS}"),
        ("kind: training\ncluster: {machines: [{count: 1000000000, gpus_per_slot: 8}]}\n",
         "cluster.machines[0].count", "more than"),
        ("kind: training\ncluster: {machines: [{count: 50000, gpus_per_slot: 8}]}\n",
         "cluster.machines", f"{MAX_GPUS} GPUs"),
        ("kind: tuning\nbudget: {samples: 1000000000}\n", "budget.samples", f"more than {MAX_TRIALS}"),
        ("kind: tuning\ngpus: 1000000000\n", "gpus", f"more than {MAX_GPUS}"),
        ("kind: serving\nbatching: {requests: .inf}\n", "batching.requests", "inf is not a finite number"),
    ],
)  # fmt: skip
def test_simulate_refuses_nan_inf_and_oversized_sizes_with_the_cap(
    tmp_path: Path, text: str, field: str, why: str
) -> None:
    path = _scenario(tmp_path, text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.field == field and why in err.value.problem, str(err.value)


def test_a_bad_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--log-level", "bogus", "validate", str(APP)])
    assert exit_.value.code == 2
    assert "argument --log-level: invalid choice: 'BOGUS'" in capsys.readouterr().err
    assert main(["--log-level", "debug", "validate", str(APP)]) == 0


def test_validate_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`tessera validate ... | head -1`: the reader leaves after one line; no BrokenPipeError traceback."""
    many = tmp_path / "many.yaml"
    many.write_text("---\n".join(f"kind: Nope{i}\n" for i in range(20_000)))
    proc = subprocess.Popen(
        [str(TESSERA), "validate", str(many)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(str(many).encode())
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 1 and err == "", err


def test_gateway_config_errors_are_one_line_naming_the_file(tmp_path: Path) -> None:
    from tessera.gateway.config import ConfigError, GatewayConfig

    latin1 = tmp_path / "gateway.yaml"
    latin1.write_bytes("models: [{name: caf\xe9}]\n".encode("latin-1"))
    nan = tmp_path / "gateway.json"
    nan.write_text('{"models": [{"name": "m", "slo_s": NaN}]}')
    for path, why in (
        (latin1, "not UTF-8 text (byte 0xe9 at offset 19)"),
        (nan, "models[0].slo_s: nan is not a finite"),
    ):
        with pytest.raises(ConfigError) as err:
            GatewayConfig.load(path)
        assert str(err.value).startswith(f"gateway configuration {path}: {why}"), str(err.value)


def test_validate_prints_no_ok_line_for_a_queue_the_hierarchy_rules_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A child guaranteed more than its parent may hold: `tessera validate` printed "OK" for both Queues,
    then the errors about them."""
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        "apiVersion: tessera.io/v1alpha1\nkind: Queue\nmetadata: {name: parent}\n"
        "spec: {guaranteedGPUs: 4, maxGPUs: 6}\n---\n"
        "apiVersion: tessera.io/v1alpha1\nkind: Queue\nmetadata: {name: child}\n"
        "spec: {parent: parent, guaranteedGPUs: 8}\n"
    )
    fine = tmp_path / "other.yaml"
    fine.write_text(
        "apiVersion: tessera.io/v1alpha1\nkind: Queue\nmetadata: {name: other}\nspec: {guaranteedGPUs: 2}\n"
    )
    assert main(["validate", str(queues), str(fine)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.startswith(f"OK {queues}")], lines
    assert any(
        "Queue/child: spec.guaranteedGPUs: must be <= the parent's maxGPUs 6" in line for line in lines
    )
    assert any("Queue/parent: spec.guaranteedGPUs: children child are guaranteed 8" in line for line in lines)
    assert f"OK {fine}" in lines
