"""matplotlib is the optional `plots` extra: the simulator runs without it, and `--plots` without it is
one line naming the extra, printed before any simulation runs."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from tessera.cli import main

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "examples" / "scenarios" / "training-csv.yaml"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes every `import matplotlib…` raise ImportError, as on an install without the extra.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.usefixtures("no_matplotlib")
def test_plots_without_matplotlib_is_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(SCENARIO), "--no-progress", "--plots", str(tmp_path / "plots")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran
    assert err.count("\n") == 1 and err.startswith("error: --plots:")
    assert "pip install 'tessera[plots]'" in err
    assert not (tmp_path / "plots").exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_simulate_runs_without_matplotlib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(SCENARIO), "--no-progress"]) == 0
    assert "themis" in capsys.readouterr().out


def test_matplotlib_is_an_extra_not_a_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("[")[0].strip().lower() for d in project["dependencies"]]
    assert "matplotlib" not in names
    extras = project["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plots"])
    assert any(d.startswith("matplotlib") for d in extras["test"])  # the plot tests still draw
