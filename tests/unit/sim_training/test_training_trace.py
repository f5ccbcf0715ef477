"""Trace reading (CSV and YAML), error messages, and the seeded generator's workload statistics."""

import random
from collections import Counter
from pathlib import Path

import pytest
from tessera.sim.training.trace import MODELS, GeneratorConfig, TraceError, generate, parse_apps, read_trace

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "scenarios"


def test_reads_the_example_yaml_and_csv_traces() -> None:
    y = read_trace(EXAMPLES / "training-small-trace.yaml")
    assert [a.id for a in y.apps] == ["vgg16", "inception", "explore", "halving"]
    assert y.apps[0].network_intensive and not y.apps[1].network_intensive
    assert y.apps[3].halving is not None and len(y.apps[3].jobs) == 4
    c = read_trace(EXAMPLES / "training-trace.csv")
    assert [a.id for a in c.apps] == ["single", "explore", "halving"]
    assert len(c.apps[1].jobs) == 3
    h = c.apps[2].halving
    assert h is not None and h.iters_per_phase == (20.0, 40.0, 80.0) and h.job_gpus == 2
    assert not c.apps[2].network_intensive


@pytest.mark.parametrize(
    ("apps", "field", "problem"),
    [
        ([{"id": "a"}], "apps[0].arrival", "is required"),
        (
            [{"arrival": -1, "jobs": [{"iterations": 1, "iter_time": 1, "gpus": 1}]}],
            "apps[0].arrival",
            "non-negative",
        ),
        (
            [{"arrival": 0, "jobs": [{"iterations": 1, "iter_time": 1, "gpus": 1.5}]}],
            "apps[0].jobs[0].gpus",
            "whole",
        ),
        (
            [{"arrival": 0, "jobs": [{"iterations": 1, "gpus": 1}]}],
            "apps[0].jobs[0].iter_time",
            "is required",
        ),
        ([{"arrival": 0, "model": "nope", "jobs": []}], "apps[0].model", "unknown model"),
        (
            [{"arrival": 0, "jobs": [{"iterations": 1, "iter_time": 1, "gpus": 99}]}],
            "apps[0]",
            "cluster has 16",
        ),
        (
            [{"arrival": 0, "halving": {"iters_per_phase": [1, 2, 3]}, "configs": [{"iter_time": 1}]}],
            "apps[0].configs",
            "at least 4 configs",
        ),
    ],
)
def test_bad_traces_name_the_field(apps: list, field: str, problem: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(TraceError) as e:
        parse_apps("t.yaml", apps, cluster_gpus=16)
    assert e.value.field == field and problem in e.value.problem
    assert str(e.value).startswith("t.yaml: ")


def test_csv_with_unknown_column(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("app,arrival,colour\na,0,red\n")
    with pytest.raises(TraceError, match=r"bad.csv: header: unknown columns \['colour'\]"):
        read_trace(p)


def test_generator_matches_the_papers_workload_shape() -> None:
    tr = generate(GeneratorConfig(apps=600, workload="w2"), random.Random(3), 64)
    cats = Counter(MODELS[a.model][0] for a in tr.apps)
    assert cats["nlp"] / 600 == pytest.approx(0.60, abs=0.06)
    assert cats["speech"] / 600 == pytest.approx(0.30, abs=0.06)
    assert cats["cv"] / 600 == pytest.approx(0.10, abs=0.04)
    single = sum(a.halving is None for a in tr.apps) / 600
    assert single == pytest.approx(0.10, abs=0.04)
    assert {j.gpus for a in tr.apps for j in a.jobs} <= {1, 2, 4, 8}
    gaps = [b.arrival - a.arrival for a, b in zip(tr.apps, tr.apps[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(600, rel=0.15)  # Poisson arrivals at the configured rate
    w1 = generate(GeneratorConfig(apps=200, workload="w1"), random.Random(3), 64)
    assert {j.gpus for a in w1.apps for j in a.jobs} <= {1, 2}
    ni = generate(GeneratorConfig(apps=100, network_intensive_share=1.0), random.Random(3), 64)
    assert all(a.network_intensive for a in ni.apps)
    # Same seed, same trace.
    assert generate(GeneratorConfig(apps=50), random.Random(9), 64) == generate(
        GeneratorConfig(apps=50), random.Random(9), 64
    )
