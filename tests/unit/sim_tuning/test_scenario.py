"""The `tuning` scenario kind: loading, errors that name file and field, running, the CLI."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tessera.sim.scenario import KINDS, ScenarioError
from tessera.sim.tuning import scenario as tuning

DEFAULT = Path(tuning.__file__).resolve().parent.parent / "data" / "tuning-default.yaml"
SMALL = {
    "kind": "tuning",
    "name": "small",
    "runs": 2,
    "gpus": 4,
    "algorithms": ["hyperband", "asha"],
    "budget": {"max_budget": 9, "samples": 12},
}


def test_kind_dispatches_to_this_module() -> None:
    assert importlib.import_module(KINDS["tuning"]) is tuning


def test_bundled_default_loads_with_both_executors() -> None:
    s = tuning.load(yaml.safe_load(DEFAULT.read_text()), str(DEFAULT))
    assert s.executors == ("fifo", "fluid")
    assert set(s.algorithms) == {"hyperband", "syncbohb", "asha", "bohb", "pbt"}
    assert s.gpus == 8 and s.fluid.c == 2


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"gpus": 0}, "gpus", "integer >= 1"),
        ({"algorithms": ["hyperband", "tpe"]}, "algorithms[1]", "unknown 'tpe'"),
        ({"executors": ["fifo", "gandiva"]}, "executors[1]", "unknown"),
        ({"fluid": {"max_pack": 0}}, "fluid", "max_pack"),
        ({"fluid": {"pack": 2}}, "fluid.pack", "unknown field"),
        ({"workload": {"alpha": 0.5}}, "workload", "alpha"),
        ({"budget": {"max_budget": 1}}, "budget.max_budget", ">= 2"),
        ({"horizon": "forever"}, "horizon", "'rung' or 'budget'"),
        ({"observe": "never"}, "observe", "'iteration' or 'milestone'"),
        ({"runz": 3}, "runz", "unknown field"),
    ],
)
def test_errors_name_file_and_field(patch: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as e:
        tuning.load({**SMALL, **patch}, "my.yaml")
    assert e.value.source == "my.yaml" and e.value.field == field
    assert words in e.value.problem


def test_run_reports_every_metric_and_fluid_wins_on_hyperband(tmp_path: Path) -> None:
    result = tuning.run(tuning.load(dict(SMALL), "small.yaml"), progress=False)
    assert len(result.cells) == 4
    assert all(len(c.runs) == 2 for c in result.cells)
    hb = result.speedup("hyperband", "makespan")
    assert hb is not None and hb > 1.3  # stage stragglers: the synchronous case Fluid helps most
    data = result.to_json()
    assert {r["executor"] for r in data["results"]} == {"fifo", "fluid"}
    assert set(data["results"][0]) >= {"time_to_target", "makespan", "utilisation", "gpu_seconds"}
    table = result.table()
    assert "hyperband" in table and "speed-up" in table
    plots = result.plots(tmp_path)
    assert len(plots) == 4 and all(p.stat().st_size > 1000 for p in plots)


def test_same_seed_same_result() -> None:
    s = tuning.load(dict(SMALL), "small.yaml")
    assert tuning.run(s).to_json() == tuning.run(s).to_json()


def test_cli_runs_a_tuning_file(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "algorithms": ["asha"], "runs": 1}))
    out = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "simulate", str(path), "--json", "--seed", "3"],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["kind"] == "tuning" and data["seed"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SMALL, "gpus": -1}))
    err = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "simulate", str(bad)], capture_output=True, text=True
    )
    assert err.returncode == 2 and f"{bad}: gpus:" in err.stderr


def test_figures_command_writes_the_documented_plots(tmp_path: Path) -> None:
    from tessera.sim.tuning import figures

    # Every figure, from a few seeds (the documented ones use 200: about 60 s, `python -m …figures`).
    assert figures.main([str(tmp_path), "--seeds", "4"]) == 0
    for name in ("fluid-macro.png", "fluid-asha-scaling.png", "fluid-overhead.png"):
        assert (tmp_path / name).stat().st_size > 1000
