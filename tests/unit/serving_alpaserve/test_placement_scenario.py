"""The ``placement`` scenario kind: the bundled example loads and runs; bad files name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tessera.sim.scenario import KINDS, ScenarioError
from tessera.sim.serving import placement_scenario as ps

DEFAULT = Path(ps.__file__).parent.parent / "data" / "placement-default.yaml"


def _data() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_registered_kind_and_bundled_example_loads() -> None:
    assert KINDS["placement"] == "tessera.sim.serving.placement_scenario"
    sc = ps.load(_data(), str(DEFAULT))
    assert sc.devices == 8 and sum(m.count for m in sc.models) == 8 and sc.sweep_param == "total_rate"


def test_small_run_reports_every_policy(tmp_path: Path) -> None:
    data = _data()
    data["workload"]["duration_s"] = 60
    data["sweep"] = {"param": "cv", "values": [3]}
    res = ps.run(ps.load(data, "x.yaml"))
    reps = res.points[0][1]
    assert [r.policy for r in reps] == ["alpaserve", "selective-replication", "clockwork++"]
    assert all(0 <= r.attainment <= 1 and r.gpus_used <= 8 for r in reps)
    assert "alpaserve" in res.table()
    assert res.to_json()["points"][0]["x"] == 3
    assert all(p.exists() for p in res.plots(tmp_path))


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"cluster": {"devices": 0}}, "cluster.devices"),
        ({"models": []}, "models"),
        ({"policies": ["nexus"]}, "policies"),
        ({"sweep": {"param": "gpus", "values": [1]}}, "sweep.param"),
        ({"cluster": {"devices": 8, "memory_units": "MB"}}, "cluster.memory_units"),
    ],
)
def test_bad_scenarios_name_the_field(patch: dict, field: str) -> None:
    data = _data() | patch
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        ps.load(data, "bad.yaml")
