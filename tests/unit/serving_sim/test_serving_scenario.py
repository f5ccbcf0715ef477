"""The ``serving`` scenario kind: the bundled example loads and runs; bad files name file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tessera.sim.scenario import KINDS, ScenarioError
from tessera.sim.serving import scenario as ss

DEFAULT = Path(ss.__file__).parent.parent / "data" / "serving-default.yaml"


def _data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(DEFAULT.read_text())
    return data


def test_registered_kind_and_bundled_example_loads() -> None:
    assert KINDS["serving"] == "tessera.sim.serving.scenario"
    sc = ss.load(_data(), str(DEFAULT))
    assert sc.batching is not None and sc.cluster is not None
    assert "orloj" in sc.batching.policies and "clockwork" in sc.batching.policies
    assert sc.cluster.policies[:2] == ["symphony", "eager"]
    assert sc.cluster.slo == pytest.approx(0.046)


def test_cluster_getbatch_and_target_rule_are_selectable() -> None:
    data = _data()
    sc = ss.load(data, "d.yaml")
    assert sc.cluster is not None and (sc.cluster.get_batch, sc.cluster.target_batch) == (
        "headGreedy",
        "modelRate",
    )
    data["cluster"].update(
        get_batch="earlyDropForTarget",
        target_batch="clusterGpus",
        policies=["symphony", "symphony-headgreedy"],
    )
    sc = ss.load(data, "d.yaml")
    assert sc.cluster is not None
    assert (sc.cluster.get_batch, sc.cluster.target_batch) == ("earlyDropForTarget", "clusterGpus")
    del data["cluster"]["policies"]
    sc = ss.load(data, "d.yaml")  # the variants run only when named
    assert sc.cluster is not None
    assert sc.cluster.policies == ["symphony", "eager", "eager-headgreedy", "shepherd", "clockwork"]


def test_small_run_reports_every_policy(tmp_path: Path) -> None:
    data = _data()
    data["batching"].update(requests=300, slo_multiples=[3])
    data["cluster"].update(loads=[0.2], duration_s=0.5, goodput=False)
    del data["cluster"]["min_gpus_rate"]
    res = ss.run(ss.load(data, "small.yaml"))
    assert set(res.batching[3.0]) == {"orloj", "clockwork", "nexus", "clipper", "timeout"}
    assert all(st.n == 300 for st in res.batching[3.0].values())
    row = res.cluster[0.2]
    assert set(row) == {"symphony", "eager", "shepherd", "clockwork"}
    # At 20 % load deferred batching leaves GPUs idle while eager keeps every GPU busy (E.5.3).
    assert row["symphony"].busy_fraction < 0.6 < 0.9 <= row["eager"].busy_fraction
    assert row["symphony"].late == 0
    text = res.table()
    assert "symphony" in text and "orloj" in text
    js = res.to_json()
    assert js["cluster"]["points"][0]["load"] == 0.2 and js["batching"][0]["slo_multiple"] == 3.0
    paths = res.plots(tmp_path)
    assert [p.name for p in paths] == ["serving-default-batching.png", "serving-default-cluster.png"]
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"batching": None, "cluster": None}, "batching/cluster"),
        ({"batching": {"modes": 0}}, "batching.modes"),
        ({"batching": {"policies": ["symphony"]}}, "batching.policies"),
        ({"batching": {"slo_multiples": []}}, "batching.slo_multiples"),
        ({"batching": {"low_ms": 90, "high_ms": 50}}, "batching.high_ms"),
        ({"cluster": {"alpha_ms": 1, "beta_ms": 10, "slo_ms": 5, "gpus": 2}}, "cluster.slo_ms"),
        ({"cluster": {"alpha_ms": 1, "beta_ms": 10, "slo_ms": 36}}, "cluster.gpus"),
        ({"cluster": {"alpha_ms": 1, "beta_ms": 10, "slo_ms": 36, "gpus": 2.5}}, "cluster.gpus"),
        (
            {"cluster": {"alpha_ms": 1, "beta_ms": 10, "slo_ms": 36, "gpus": 2, "policies": ["orloj"]}},
            "cluster.policies",
        ),
        ({"cluster": [1, 2]}, "cluster"),
        (
            {"cluster": {"alpha_ms": 1, "beta_ms": 10, "slo_ms": 36, "gpus": 2, "target_batch": "nope"}},
            "cluster.target_batch",
        ),
    ],
)
def test_bad_scenarios_name_the_file_and_field(patch: dict[str, Any], field: str) -> None:
    data = {k: v for k, v in (_data() | patch).items() if v is not None}
    with pytest.raises(ScenarioError, match=r"^bad\.yaml: " + field.replace(".", r"\.").replace("/", "/")):
        ss.load(data, "bad.yaml")
