"""The OpenMetrics writer and the training export, read back with prometheus-client's OpenMetrics parser."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from tessera.api import metrics_catalog as catalog
from tessera.sim.metrics_export import (
    Sample,
    policy_namespace,
    training_samples,
    write_openmetrics,
    write_training_openmetrics,
)


def _parse(path: Path) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(path.read_text())}


def _series(families: dict[str, Any], family: str, sample_name: str | None = None) -> list[tuple[Any, ...]]:
    name = sample_name or family
    return [
        (s.labels, s.value, float(s.timestamp.sec) + s.timestamp.nsec / 1e9)
        for s in families[family].samples
        if s.name == name
    ]


def test_gauges_counters_and_histograms_round_trip(tmp_path: Path) -> None:
    ns = {"namespace": "ml", "modeldeployment": "bert"}
    samples = [
        Sample("tessera_app_rho", {"namespace": "ml", "app": "b"}, 1.25, 1000.5),
        Sample("tessera_app_rho", {"namespace": "ml", "app": "a"}, 0.8, 1060.0),
        Sample("tessera_app_rho", {"namespace": "ml", "app": "a"}, 0.9, 1000.0),  # out of order on purpose
        Sample("tessera_auction_rounds_total", {}, 1, 1000.0),
        Sample("tessera_auction_rounds_total", {}, 2, 1060.0),
        *(
            Sample("tessera_serving_batch_size_bucket", {**ns, "le": le}, c, 1000.0)
            for le, c in [("+Inf", 3), ("1.0", 1), ("4.0", 3)]
        ),
        Sample("tessera_serving_batch_size_sum", ns, 9, 1000.0),
        Sample("tessera_serving_batch_size_count", ns, 3, 1000.0),
    ]
    out = tmp_path / "x.om"
    assert write_openmetrics(samples, out) == len(samples)
    text = out.read_text()
    assert text.endswith("# EOF\n")
    spec = catalog.get("tessera_app_rho")
    assert f"# HELP tessera_app_rho {spec.help}" in text
    assert "# TYPE tessera_auction_rounds counter" in text

    fam = _parse(out)
    assert fam["tessera_app_rho"].type == "gauge"
    assert _series(fam, "tessera_app_rho") == [
        ({"namespace": "ml", "app": "a"}, 0.9, 1000.0),
        ({"namespace": "ml", "app": "a"}, 0.8, 1060.0),
        ({"namespace": "ml", "app": "b"}, 1.25, 1000.5),
    ]
    assert fam["tessera_auction_rounds"].type == "counter"
    assert [v for _, v, _ in _series(fam, "tessera_auction_rounds", "tessera_auction_rounds_total")] == [1, 2]
    hist = fam["tessera_serving_batch_size"]
    assert hist.type == "histogram"
    assert [s.labels.get("le") for s in hist.samples if s.name.endswith("_bucket")] == ["1.0", "4.0", "+Inf"]


def test_label_values_are_escaped(tmp_path: Path) -> None:
    odd = 'we"ird\\app\nname'
    out = tmp_path / "x.om"
    write_openmetrics([Sample("tessera_app_gpus", {"namespace": "ml", "app": odd}, 2, 5.0)], out)
    ((labels, value, ts),) = _series(_parse(out), "tessera_app_gpus")
    assert labels["app"] == odd and value == 2 and ts == 5.0


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([Sample("tessera_nope", {}, 1, 1.0)], "not in the Tessera metric catalogue"),
        ([Sample("tessera_app_rho", {"app": "a"}, 1, 1.0)], "wants exactly ['app', 'namespace']"),
        ([Sample("tessera_app_rho", {"namespace": "n", "app": "a", "policy": "x"}, 1, 1.0)], "wants exactly"),
        ([Sample("tessera_app_rho", {"namespace": "n", "app": "a"}, 1, math.nan)], "not a Unix time"),
        (
            [
                Sample("tessera_auction_rounds_total", {}, 2, 1.0),
                Sample("tessera_auction_rounds_total", {}, 1, 2.0),
            ],
            "goes down from 2 to 1",
        ),
        (
            [Sample("tessera_app_gpus", {"namespace": "n", "app": "a"}, v, 1.0) for v in (1, 2)],
            "two values at timestamp 1.0",
        ),
        ([Sample("tessera_auction_rounds_total", {}, -1, 1.0)], "counter sample"),
    ],
)
def test_bad_samples_are_refused_with_the_reason(tmp_path: Path, samples: list[Sample], message: str) -> None:
    out = tmp_path / "x.om"
    with pytest.raises(ValueError) as err:
        write_openmetrics(samples, out)
    assert message in str(err.value)
    assert not out.exists()


# --- training export -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    app_id: str
    arrival: float
    finish: float
    rho: float
    rejected: bool = False


@dataclass
class Run:
    policy: str
    apps: list[Outcome]
    rho_timeline: list[tuple[float, str, float, int]]


@dataclass
class Result:
    runs: list[Any] = field(default_factory=list)


# Two Apps under one policy: rounds at 0, 600 and 1200 s; A finishes at 1500 s with ρ 1.5, B at 1900 s.
TIMELINE = [
    (0.0, "a", math.inf, 0),  # no estimate yet: no ρ sample, as the operator leaves the gauge unset
    (0.0, "b", 1.0, 4),
    (600.0, "a", 1.2, 2),
    (600.0, "b", 1.1, 2),
    (1200.0, "a", 1.4, 2),
    (1200.0, "b", 1.05, 2),
]
APPS = [
    Outcome("a", 0.0, 1500.0, 1.5),
    Outcome("b", 100.0, 1900.0, 1.2),
    Outcome("c", 50.0, 50.0, math.nan, True),
]


def test_training_samples_follow_the_timeline_and_the_outcomes() -> None:
    run = Run("themis", APPS, TIMELINE)
    got = training_samples(run, "sim-themis", 1000.0, step_s=300.0)  # type: ignore[arg-type]

    def values(name: str, **labels: str) -> list[tuple[float, float]]:
        return [
            (s.timestamp - 1000.0, s.value)
            for s in got
            if s.name == name and labels.items() <= s.labels.items()
        ]

    assert values("tessera_app_rho", app="a") == [(600, 1.2), (1200, 1.4), (1500, 1.5)]
    assert values("tessera_app_gpus", app="b") == [(0, 4), (600, 2), (1200, 2), (1900, 0)]
    assert values("tessera_namespace_gpus") == [(0, 4), (600, 4), (1200, 4)]
    # T_shared = finish - arrival (1800 s for b); T_independent = T_shared / ρ (1800 / 1.2).
    assert values("tessera_app_t_shared_seconds", app="b") == [(1900, 1800)]
    assert values("tessera_app_t_independent_seconds", app="b") == [(1900, pytest.approx(1500))]
    # Rounds at 0/600/1200 and a point every 300 s up to the last finish (1900 s).
    rounds = sorted(values("tessera_auction_rounds_total"))
    assert rounds == [(0, 1), (300, 1), (600, 2), (900, 2), (1200, 3), (1500, 3), (1800, 3)]
    assert not values("tessera_app_rho", app="c") and not values("tessera_app_gpus", app="c")
    assert {s.labels.get("namespace") for s in got if s.labels} == {"sim-themis"}


def test_policies_get_namespaces_and_one_run_owns_the_rounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = [Run(p, APPS, TIMELINE) for p in ("themis", "themis-f0", "DRF")]
    out = tmp_path / "run.om"
    with caplog.at_level(logging.WARNING, logger="tessera.sim.metrics_export"):
        n = write_training_openmetrics(Result(runs), out, start_unix=1_700_000_000.0, step_s=600.0)
    assert "writing themis's rounds, not themis-f0's" in caplog.text
    fam = _parse(out)
    assert n == sum(len(f.samples) for f in fam.values())
    assert {s.labels["namespace"] for s in fam["tessera_app_rho"].samples} == {
        "sim-themis",
        "sim-themis-f0",
        "sim-drf",
    }
    rounds = _series(fam, "tessera_auction_rounds", "tessera_auction_rounds_total")
    assert [v for _, v, _ in rounds] == [1, 2, 3, 3]  # one run's counter only
    build = _series(fam, "tessera_build_info")
    assert {tuple(sorted(lb.items())) for lb, _, _ in build} == {
        (("component", "simulator"), ("version", __import__("tessera").__version__))
    }
    assert min(t for *_, t in build) == 1_700_000_000.0 and max(t for *_, t in build) == 1_700_001_900.0

    only = tmp_path / "drf.om"
    write_training_openmetrics(Result(runs), only, start_unix=0.0, policies=["DRF"])
    fam = _parse(only)
    assert {s.labels["namespace"] for s in fam["tessera_app_gpus"].samples} == {"sim-drf"}
    assert "tessera_auction_rounds" not in fam  # DRF runs no auctions


def test_default_start_puts_the_last_sample_at_now(tmp_path: Path) -> None:
    out = tmp_path / "run.om"
    before = time.time()
    write_training_openmetrics(Result([Run("themis", APPS, TIMELINE)]), out)
    fam = _parse(out)
    last = max(t for name, f in fam.items() for s in f.samples for *_, t in _series(fam, name, s.name))
    assert before - 1 <= last <= time.time() + 1


@pytest.mark.parametrize(
    ("result", "kwargs", "message"),
    [
        (
            Result([Run("themis", APPS, TIMELINE)]),
            {"policies": ["tiresias"]},
            "no run for policies ['tiresias']",
        ),
        (Result([]), {}, "no runs to export"),
        (Result([Outcome("a", 0, 1, 1)]), {}, "has no rho_timeline"),
        (Result([Run("a", APPS, TIMELINE), Run("A", APPS, TIMELINE)]), {}, "both map to namespace 'sim-a'"),
        (Result([Run("themis", APPS, TIMELINE)]), {"step_s": 0.0}, "step_s must be a positive"),
        (Result([Run("themis", APPS, TIMELINE)]), {"start_unix": -10.0}, "before 1970"),
    ],
)
def test_bad_exports_are_refused(
    tmp_path: Path, result: Result, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        write_training_openmetrics(result, tmp_path / "x.om", **kwargs)
    assert message in str(err.value)


def test_policy_namespaces_are_dns_labels() -> None:
    assert policy_namespace("sim", "themis-f0.8") == "sim-themis-f0-8"
    assert policy_namespace("sim", "Themis_F0") == "sim-themis-f0"
    assert len(policy_namespace("sim", "x" * 100)) == 63
    with pytest.raises(ValueError, match="cannot make a namespace"):
        policy_namespace("", "---")
