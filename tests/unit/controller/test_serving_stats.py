"""Rates from two reads of a gateway's counters, the reader's rate limit and failures, and the gateway
objects' gRPC port."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.controller.pods import Owner
from tessera.controller.serving import gateway_service_url, record_from_body
from tessera.controller.serving_stats import Counters, StatsError, StatsReader, window
from tessera.gateway.config import GatewayConfig


def doc(uptime: float, met: int, missed: int = 0, dropped: int = 0, rejected: int = 0, **kw: Any) -> dict:
    return {
        "instance": kw.get("instance", "a"),
        "uptime_s": uptime,
        "models": {
            "m": {
                "workers": kw.get("workers", 2),
                "busy_seconds": kw.get("busy", 0.0),
                "requests": {"slo_met": met, "slo_missed": missed, "dropped": dropped, "rejected": rejected},
            }
        },
    }


def c(*args: Any, **kw: Any) -> Counters:
    return Counters.parse(doc(*args, **kw), "m")


def test_rates_over_the_window_between_two_reads() -> None:
    # 10 s: 80 met, 10 missed, 10 dropped (and 5 refused as bad input: on neither side); 2 workers busy
    # 4 s + 6 s of the 20 worker-seconds → 50 % idle.
    w = window(c(100.0, 20, 1, 2, 3, busy=5.0), c(110.0, 100, 11, 12, 8, busy=15.0))
    assert w is not None
    assert w.seconds == pytest.approx(10.0)
    assert w.requests == 100
    assert w.goodput_rps == pytest.approx(8.0)
    assert w.attainment_percent == pytest.approx(80.0)
    assert w.idle_percent == pytest.approx(50.0)
    # Offered load the replica rule follows: goodput / attainment = 10 rps (100 requests in 10 s).
    assert w.goodput_rps / (w.attainment_percent / 100) == pytest.approx(10.0)
    st = w.status()
    assert st == {
        "goodputRps": 8.0,
        "sloAttainmentPercent": 80.0,
        "gpuIdlePercent": 50.0,
        "statsWindowSeconds": 10.0,
        "statsRequests": 100,
    }


def test_no_request_is_unknown_attainment_not_100_percent() -> None:
    w = window(c(1.0, 5), c(3.0, 5))
    assert w is not None and w.requests == 0 and w.goodput_rps == 0.0
    assert w.attainment_percent is None and w.status()["sloAttainmentPercent"] is None
    assert w.idle_percent == 100.0


def test_busy_beyond_the_window_clamps_idle_to_zero() -> None:
    w = window(c(0.0, 0, busy=0.0), c(1.0, 1, busy=5.0))
    assert w is not None and w.idle_percent == 0.0


@pytest.mark.parametrize(
    "cur",
    [
        c(20.0, 50, instance="b"),  # the gateway restarted: another instance
        c(5.0, 50),  # its clock went back
        c(20.0, 5),  # a counter went back
        Counters("a", 20.0, 50, 0, 0, 0, 0.5, 2),  # busy seconds went back
        c(10.0, 10, busy=1.0),  # no time passed
    ],
)
def test_a_window_never_spans_two_gateways_or_goes_back(cur: Counters) -> None:
    assert window(c(10.0, 10, busy=1.0), cur) is None


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ([], "not a JSON object"),
        ({"instance": "a", "uptime_s": 1.0, "models": {}}, "does not serve model 'm'"),
        ({"instance": "a", "models": {"m": {"workers": 1, "requests": {}}}}, "lack 'uptime_s'"),
        ({**doc(1.0, 1), "uptime_s": "1"}, "not a counters document"),
        (doc(1.0, -1), "negative"),
    ],
)
def test_what_is_not_counters_is_an_error_that_says_why(bad: object, says: str) -> None:
    with pytest.raises(StatsError, match=says):
        Counters.parse(bad, "m")


async def test_reader_reads_at_most_every_interval_and_restarts_the_baseline_after_a_failure() -> None:
    now = [0.0]
    answers: list[object] = [doc(0.0, 0), doc(5.0, 50), StatsError("connection refused"), doc(15.0, 90)]
    urls: list[str] = []

    async def fetch(url: str) -> object:
        urls.append(url)
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    r = StatsReader(5.0, lambda ns, name: f"http://{name}.{ns}", fetch=fetch, clock=lambda: now[0])
    first = await r.poll(("ml", "m"), "m")
    assert first is not None and first.stats is None and first.error is None  # baseline only
    now[0] = 4.9
    assert await r.poll(("ml", "m"), "m") is None  # not due: nothing fetched
    now[0] = 5.0
    second = await r.poll(("ml", "m"), "m")
    assert second is not None and second.stats is not None and second.stats.goodput_rps == 10.0
    now[0] = 10.0
    third = await r.poll(("ml", "m"), "m")
    assert third is not None and third.error == "http://m.ml: connection refused"
    now[0] = 15.0
    fourth = await r.poll(("ml", "m"), "m")
    assert fourth is not None and fourth.stats is None  # a fresh baseline: no window across the gap
    assert urls == ["http://m.ml"] * 4


def body(**frontend: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ml", "uid": "u-m"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}},
            "model": {"name": "resnet"},
            "slo": {"latencyMs": 100},
            "batching": {
                "supportedBatchSizes": [1, 2],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15]},
            },
            **({"frontend": frontend} if frontend else {}),
        },
    }


def objects(b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rec = record_from_body(b)
    rec.gpus = [["n1/0"]]
    out = {}
    for kind, obj in rec.gateway_objects(Owner("ModelDeployment", "m", "ml", "u-m"), "tessera:1"):
        out[f"{kind}/{obj['metadata']['name']}"] = obj
    return out


def test_grpc_port_on_by_default_in_config_container_and_service() -> None:
    o = objects(body())
    config = GatewayConfig.model_validate_json(o["configmaps/m-gateway"]["data"]["gateway.json"])
    assert config.grpc_port == 8001
    ports = o["deployments/m-gateway"]["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {p["name"]: p["containerPort"] for p in ports} == {"http": 8080, "grpc": 8001}
    svc = {p["name"]: (p["port"], p["targetPort"]) for p in o["services/m-gateway"]["spec"]["ports"]}
    assert svc == {"http": (80, 8080), "grpc": (8001, 8001)}
    assert gateway_service_url("ml", "m") == "http://m-gateway.ml.svc:80"


def test_grpc_port_zero_serves_http_only_and_another_port_moves_it() -> None:
    o = objects(body(grpcPort=0))
    assert (
        GatewayConfig.model_validate_json(o["configmaps/m-gateway"]["data"]["gateway.json"]).grpc_port is None
    )
    assert [p["name"] for p in o["services/m-gateway"]["spec"]["ports"]] == ["http"]
    o = objects(body(grpcPort=9100))
    ports = o["deployments/m-gateway"]["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"containerPort": 9100, "name": "grpc"} in ports
