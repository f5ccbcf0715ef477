"""`tessera simulate` kind packing: scenario validation, the synthetic generator and the CLI on a small run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tessera.cli import main as cli_main
from tessera.sim.packing import synthetic
from tessera.sim.packing.scenario import load, run
from tessera.sim.packing.trace import PackingTraceError, read_nodes, read_pods
from tessera.sim.scenario import ScenarioError

SMALL = {
    "kind": "packing",
    "name": "tiny",
    "seeds": [0, 1],
    "policies": ["first-fit", "best-fit", "fgd", "tessera"],
    "synthetic": {
        "nodes": [
            {"count": 6, "gpus": 4, "model": "A", "cpu_milli": 32000, "memory_mib": 131072},
            {"count": 4, "gpus": 2, "model": "B", "cpu_milli": 8000, "memory_mib": 65536},
        ],
        "pods": {
            "population": 300,
            "cpu_only": 0.1,
            "fractional": 0.5,
            "whole": 0.3,
            "multi": 0.1,
            "multi_gpus": [2, 4],
            "gpu_models": {"B": 0.2},
        },
    },
    "through_extender": True,
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seeds": []}, "seeds"),
        ({"policies": ["worst-fit"]}, "policies[0]"),
        ({"node_sample": 0}, "node_sample"),
        ({"tessera": {"decay": 2}}, "tessera.decay"),
        ({"tessera": {"prior": "oracle"}}, "tessera.prior"),
        ({"trace": "x"}, "trace"),
    ],
)
def test_bad_scenarios_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load({**SMALL, **change}, "s.yaml")
    assert err.value.field == field


def test_bad_synthetic_fields() -> None:
    bad = {
        **SMALL,
        "synthetic": {"nodes": [{"count": 1, "gpus": 0, "cpu_milli": 1, "memory_mib": 1}], "pods": {}},
    }
    with pytest.raises(ScenarioError, match=r"synthetic.nodes\[0\].gpus"):
        load(bad, "s.yaml")
    mix = {**SMALL["synthetic"], "pods": {"fractional_milli": [1500]}}  # type: ignore[dict-item]
    with pytest.raises(ScenarioError, match="fractional_milli"):
        load({**SMALL, "synthetic": mix}, "s.yaml")


def test_synthetic_population_follows_the_mix() -> None:
    mix = synthetic.load_mix(
        {
            "population": 2000,
            "cpu_only": 1,
            "fractional": 1,
            "whole": 1,
            "multi": 1,
            "gpu_models": {"A": 0.5},
        },
        "s",
    )
    pods = synthetic.population(mix, 0)
    kinds = [0 if not p.gpus else 1 if p.compute < 1 else 2 if p.gpus == 1 else 3 for p in pods]
    for k in range(4):
        assert 0.2 < kinds.count(k) / len(pods) < 0.3
    constrained = [p for p in pods if p.gpus and p.models == frozenset({"A"})]
    assert 0.4 < len(constrained) / sum(1 for p in pods if p.gpus) < 0.6
    assert synthetic.population(mix, 0) == pods  # seeded


def test_small_run_and_extender_agree() -> None:
    res = run(load(SMALL, "s.yaml"))
    assert set(res.curves) == {"first-fit", "best-fit", "fgd", "tessera"}
    for cs in res.curves.values():
        assert len(cs) == 2 and all(len(c.unallocated) == 100 for c in cs)
        for c in cs:  # capacity only fills up; failures only add up
            assert all(0 <= b <= a <= 1 for a, b in zip(c.unallocated, c.unallocated[1:], strict=False))
            assert all(a <= b for a, b in zip(c.failed, c.failed[1:], strict=False))
    assert res.extender["same"] == res.extender["pods"]
    assert "tessera" in res.table()


def test_cli_runs_a_packing_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump({**SMALL, "through_extender": False, "policies": ["first-fit", "tessera"]})
    )
    assert cli_main(["simulate", str(path), "--json", "--seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == [3] and set(out["policies"]) == {"first-fit", "tessera"}


def test_trace_reader_errors(tmp_path: Path) -> None:
    (tmp_path / "n.csv").write_text("sn,cpu_milli,memory_mib,gpu\nx,1,1,2\n")
    with pytest.raises(PackingTraceError, match="missing column"):
        read_nodes(tmp_path / "n.csv")
    (tmp_path / "p.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,2000\n")
    with pytest.raises(PackingTraceError, match=r"p.csv:2: gpu_milli"):
        read_pods(tmp_path / "p.csv")
    with pytest.raises(PackingTraceError, match="No such file"):
        read_pods(tmp_path / "absent.csv")


def test_synthetic_node_names_unique() -> None:
    nodes = synthetic.load_nodes(
        [{"count": 3, "gpus": 1, "model": "A", "cpu_milli": 1, "memory_mib": 1}] * 2, "s.yaml"
    )
    assert len({n.name for n in nodes}) == 6
