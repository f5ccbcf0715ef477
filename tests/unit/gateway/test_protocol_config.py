"""v2 JSON tensor handling and gateway configuration."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tessera.gateway.config import ConfigError, GatewayConfig, build_scheduler
from tessera.gateway.profiler import CapturedRequest, OnlineProfiler
from tessera.gateway.protocol import ProtocolError, decode_tensor, encode_tensor, rows, validate_request
from tessera.policy.serving.baselines.batching import TimeoutScheduler
from tessera.policy.serving.common import Request
from tessera.policy.serving.orloj import OrlojScheduler
from tessera.policy.serving.symphony import SymphonyScheduler


def tensor(
    name: str = "x", shape: list[int] | None = None, dt: str = "FP32", data: object = None
) -> dict[str, object]:
    return {
        "name": name,
        "shape": shape or [1, 3],
        "datatype": dt,
        "data": data if data is not None else [1, 2, 3],
    }


def test_decode_encode_round_trip_keeps_shape_and_type() -> None:
    arr = decode_tensor(tensor(shape=[2, 2], data=[[1, 2], [3, 4]]))
    assert arr.dtype == np.float32 and arr.shape == (2, 2)
    assert encode_tensor("y", arr) == {
        "name": "y",
        "shape": [2, 2],
        "datatype": "FP32",
        "data": [1.0, 2.0, 3.0, 4.0],
    }
    assert encode_tensor("n", np.array([[7]], dtype=np.int64))["datatype"] == "INT64"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"inputs": []}, "non-empty 'inputs'"),
        ({"inputs": [tensor(), tensor()]}, "appears twice"),
        ({"inputs": [{**tensor(), "shape": []}]}, "'shape'"),
        ({"inputs": [tensor(dt="BYTES")]}, "BYTES"),
        ({"inputs": [tensor(dt="FLOAT")]}, "unknown datatype"),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "no 'data'"),
    ],
)
def test_malformed_requests_are_refused_with_the_reason(body: object, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        validate_request(body)


def test_element_count_and_batch_dimension_are_checked() -> None:
    with pytest.raises(ProtocolError, match="needs 6 values, got 3"):
        decode_tensor(tensor(shape=[2, 3]))
    with pytest.raises(ProtocolError, match="first"):
        rows([tensor(shape=[1, 3]), tensor("n", shape=[2, 1], data=[1, 2])])
    assert rows([tensor(shape=[2, 3], data=list(range(6)))]) == 2


BASE = {"name": "m", "slo_s": 0.05, "workers": ["http://127.0.0.1:9001/"]}


def test_each_policy_builds_its_scheduler() -> None:
    orloj = GatewayConfig.parse({"models": [{**BASE, "policy": "orloj", "priors": {"a": [0.01, 0.02]}}]})
    assert isinstance(build_scheduler(orloj.models[0]), OrlojScheduler)
    assert orloj.models[0].workers == ["http://127.0.0.1:9001"]
    assert orloj.models[0].profiler_options.sample_rate == 0.02  # Orloj learns online by default
    t = GatewayConfig.parse({"models": [{**BASE, "policy": "timeout", "mean_solo_s": 0.01}]}).models[0]
    assert isinstance(build_scheduler(t), TimeoutScheduler)
    assert t.profiler_options.sample_rate == 0.0
    s = GatewayConfig.parse(
        {"models": [{**BASE, "policy": "symphony", "symphony": {"alpha": 0.001, "beta": 0.005}}]}
    )
    assert isinstance(build_scheduler(s.models[0]), SymphonyScheduler)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({**BASE, "policy": "orloj"}, "needs 'priors'"),
        ({**BASE, "policy": "symphony"}, "needs 'symphony'"),
        ({**BASE, "policy": "nexus", "mean_solo_s": 0.01}, "needs 'nexus'"),
        ({**BASE, "policy": "timeout"}, "mean_solo_s"),
        ({**BASE, "policy": "fifo", "mean_solo_s": 0.01}, "policy"),
        ({**BASE, "policy": "timeout", "mean_solo_s": 0.01, "workers": ["127.0.0.1:1"]}, "http://"),
        ({**BASE, "policy": "timeout", "mean_solo_s": 0.01, "slo": 1}, "slo"),
    ],
)
def test_bad_configuration_names_the_field(model: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GatewayConfig.parse({"models": [model]})


def test_duplicate_models_and_unreadable_files_are_refused(tmp_path: object) -> None:
    m = {**BASE, "policy": "timeout", "mean_solo_s": 0.01}
    with pytest.raises(ConfigError, match="unique"):
        GatewayConfig.parse({"models": [m, m]})
    with pytest.raises(ConfigError, match="cannot read"):
        GatewayConfig.load("/nonexistent/gateway.yaml")


def test_profiler_samples_at_its_rate_and_respects_its_share_of_worker_time() -> None:
    prof = OnlineProfiler(0.25, 0.05, 10_000, random.Random(4))
    reqs = [CapturedRequest(Request(i, "m", 0.0, 1.0), b"{}") for i in range(4000)]
    prof.offer(reqs, batch_seconds=10.0)
    taken = prof.take(10_000)
    assert 900 <= len(taken) <= 1100  # 25% of 4000, binomial spread
    prof.offer(reqs, batch_seconds=1.0)
    prof.record(seconds=0.6, count=len(taken))  # 0.6 s of profiling > 5% of 11 s of batches
    assert prof.take(4) == []
    prof.offer([], batch_seconds=2.0)  # 5% of 13 s = 0.65 s: profiling may resume
    assert len(prof.take(4)) == 4
