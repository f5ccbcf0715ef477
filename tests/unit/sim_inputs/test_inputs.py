"""Every simulator input is a pydantic model: errors name the field path, the caps hold, and the published
JSON Schema (docs/scenario.schema.json) is the models' own and accepts every bundled scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tessera.commands.simulate import load_scenario
from tessera.sim.scenario import MAX_GPUS, ScenarioError
from tessera.sim.schema import dumps, scenario_schema, trace_schema
from tessera.sim.training.trace import TraceError, parse_apps, read_trace

ROOT = Path(__file__).parents[3]
SCENARIOS = sorted(
    p
    for p in [*ROOT.glob("examples/scenarios/*.yaml"), *ROOT.glob("operator/tessera/sim/data/*.yaml")]
    if "apps" not in (yaml.safe_load(p.read_text()) or {})  # trace files, not scenarios
)
JOB = {"iterations": 10, "iter_time": 1.0, "gpus": 1}
# Rules across fields, which the JSON Schema does not express: an unknown `kind` matches no branch (the
# loader names it), a baseline given a Themis knob, a range given high before low.
SCHEMA_CANNOT_SAY = {"kind", "policies[0].fairness_knob", "synthetic.pods.cpu_per_gpu_milli"}


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / name).read_text()))


def test_the_committed_schemas_are_generated_from_the_models() -> None:
    for name, schema in (("scenario.schema.json", scenario_schema()), ("trace.schema.json", trace_schema())):
        on_disk = (ROOT / "docs" / name).read_text()
        assert on_disk == dumps(schema), (
            f"docs/{name} is stale: run .venv/bin/python hack/gen-scenario-schema.py"
        )


def test_the_generator_check_mode_finds_a_stale_schema(tmp_path: Path) -> None:
    gen = [sys.executable, str(ROOT / "hack" / "gen-scenario-schema.py"), "--out", str(tmp_path)]
    subprocess.run(gen, check=True, timeout=120)
    assert subprocess.run([*gen, "--check"], timeout=120).returncode == 0
    (tmp_path / "scenario.schema.json").write_text("{}\n")
    assert subprocess.run([*gen, "--check"], capture_output=True, timeout=120).returncode == 1


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_bundled_scenario_loads_and_matches_the_schema(path: Path) -> None:
    if yaml.safe_load(path.read_text()).get("kind") == "packing" and "trace:" in path.read_text():
        pytest.importorskip(
            "numpy"
        )  # loads Alibaba's trace when present; the schema check below is the point
    errors = [
        e.message for e in _validator("scenario.schema.json").iter_errors(yaml.safe_load(path.read_text()))
    ]
    assert errors == []
    try:
        load_scenario(path)
    except ScenarioError as e:  # only a missing external trace folder may stop a bundled scenario
        assert e.field == "trace" and "found" in e.problem, str(e)


def test_a_trace_file_matches_the_trace_schema() -> None:
    data = yaml.safe_load((ROOT / "examples/scenarios/training-small-trace.yaml").read_text())
    assert list(_validator("trace.schema.json").iter_errors(data)) == []


@pytest.mark.parametrize(
    ("scenario", "field", "why"),
    [
        ({"cluster": {"machines": [{"gpus_per_slot": 2}, {"gpus_per_slot": True}]}},
         "cluster.machines[1].gpus_per_slot", "must be an integer"),
        ({"cluster": {"machines": [{"gpus_per_slot": MAX_GPUS + 1}]}},
         "cluster.machines[0].gpus_per_slot", f"more than {MAX_GPUS}"),
        ({"trace": {"apps": [{"arrival": 0, "jobs": [JOB, {**JOB, "gpus": "2"}]}]}},
         "trace.apps[0].jobs[1].gpus", "must be an integer"),
        ({"trace": {"generate": {"apps": 3, "workload": "w3"}}}, "trace.generate.workload", "'w1' or 'w2'"),
        ({"themis": {"fairness_knob": "high"}}, "themis.fairness_knob", "must be a number"),
        ({"sim": {"restart_s": 30, "bogus": 1}}, "sim.bogus", "unknown field; known: "),
        ({"policies": [{"policy": "drf", "fairness_knob": 0.5}]}, "policies[0].fairness_knob", "unknown field"),
        ({"kind": "tuning", "fluid": {"max_pack": 2.5}}, "fluid.max_pack", "must be an integer"),
        ({"kind": "tuning", "algorithms": ["asha", "tpe"]}, "algorithms[1]", "unknown 'tpe'"),
        ({"kind": "serving", "cluster": {"alpha_ms": 1, "beta_ms": 1, "slo_ms": 9, "gpus": 1,
          "policies": ["symphony", "magic"]}}, "cluster.policies[1]", "unknown 'magic'"),
        ({"kind": "placement", "cluster": {"devices": 2}, "models": [{"name": "m", "latency_ms": 5,
          "size_gb": -1}], "workload": {"total_rate": 1}}, "models[0].size_gb", "positive number"),
        ({"kind": "placement", "cluster": {"devices": 2}, "models": [], "workload": {"total_rate": 1}},
         "models", "at least 1 item"),
        ({"kind": "orion", "workload": {"rate_rps": 1e400}}, "workload.rate_rps", "not a finite number"),
        ({"kind": "packing", "synthetic": {"nodes": [{"gpus": 1, "cpu_milli": 1, "memory_mib": 1}],
          "pods": {"cpu_per_gpu_milli": [5, 1]}}}, "synthetic.pods.cpu_per_gpu_milli", "low <= high"),
        ({"kind": "nope"}, "kind", "unknown kind"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named_by_its_path_and_refused_by_the_schema(
    tmp_path: Path, scenario: dict[str, Any], field: str, why: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert (err.value.field, err.value.source) == (field, str(path)), str(err.value)
    assert why in err.value.problem, str(err.value)
    assert str(err.value) == f"{path}: {field}: {err.value.problem}"
    if field not in SCHEMA_CANNOT_SAY:
        assert list(_validator("scenario.schema.json").iter_errors(scenario)), "the schema accepted it"


def test_trace_errors_name_the_app_job_and_field() -> None:
    apps = [{"id": f"a{i}", "arrival": i, "jobs": [JOB]} for i in range(4)]
    apps[3]["jobs"] = [{**JOB, "gpus": 0}]
    with pytest.raises(TraceError) as err:
        parse_apps("t.yaml", apps)
    assert str(err.value) == "t.yaml: apps[3].jobs[0].gpus: must be an integer >= 1, got 0"
    apps[3]["jobs"] = [JOB]
    apps[2]["tuning"] = {"fluid": {"max_pack": "two"}}
    del apps[2]["jobs"]
    with pytest.raises(TraceError, match=r"apps\[2\]\.tuning\.fluid\.max_pack: must be an integer"):
        parse_apps("t.yaml", apps)


@pytest.mark.parametrize(
    ("rows", "field", "why"),
    [
        ("a,0,10,1.0,1.5\n", "apps[0].jobs[0].gpus", "must be an integer"),
        ("a,nan,10,1.0,1\n", "apps[0].arrival", "not a finite number"),
        ("a,soon,10,1.0,1\n", "apps[0].arrival", "must be a number, got 'soon'"),
        ("a,0,10,1.0,1\nb,5,0,1.0,1\n", "apps[1].jobs[0].iterations", "positive number"),
    ],
)
def test_csv_cells_are_checked_by_the_same_models(tmp_path: Path, rows: str, field: str, why: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text("app,arrival,iterations,iter_time,gpus\n" + rows)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert err.value.field == field and why in err.value.problem, str(err.value)


def test_csv_numbers_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("app,arrival,network_intensive,iterations,iter_time,gpus\na,60,no,100,0.5,2\n")
    (app,) = read_trace(path).apps
    assert (app.arrival, app.network_intensive, app.jobs[0].gpus, app.jobs[0].iterations) == (
        60,
        False,
        2,
        100,
    )
