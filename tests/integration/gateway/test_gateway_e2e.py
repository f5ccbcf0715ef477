"""End to end on loopback: `tessera gateway`, two `tessera worker` processes running the early-exit ONNX
model, and the load generator (issue 9 "done when").

The workers pad every run to a modelled, input-dependent time (`--pace-*`, gateway_harness.PACE): short
requests ~20 ms, long ones ~80 ms, batches padded to their longest row and stretched 20% per extra row.
That makes the data-dependent cost the schedulers plan around dominate the few milliseconds of Python,
HTTP and CPU contention on a shared 2-core machine, so the comparison measures the policies, not the
machine. The regime is the one Orloj targets (Orloj §5: a bimodal dynamic model
at 2× SLO): SLO = 2 × P99 of the calibrated solo times, Poisson load at 0.8 × the two workers'
calibrated batch-1 capacity — there Tessera's simulator gives Orloj ~0.98 against timeout batching's
~0.40 (tessera.sim with the same batching model). The policies alternate in short rounds and totals
are compared.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from tessera.api.contract import HEADER_APP
from tessera.gateway.demo_models import early_exit_reference
from tessera.gateway.loadgen import AppLoad, RequestResult, format_summary, run_load, summarize

from .gateway_harness import MODEL, PACE, WIDTH, gateway_process, model_config, payloads, worker_process
from .tripwire import tripwire

pytestmark = pytest.mark.slow

LOAD = 1.2  # offered load / calibrated batch-1 capacity of the two workers
ROUND_S = 1.0
ROUNDS = 4
# Orloj's finish rate minus timeout batching's, over all rounds. The simulated gap in this regime is
# ~0.5; six runs here (two beside a CPU-bound process) gave 0.18-0.33, mean 0.26 (docs/serving-gateway.md).
MARGIN = 0.10
ANSWER_STATUSES = {200, 503, 504}


def regime(calibration: dict[str, Any]) -> tuple[float, float]:
    """(SLO seconds, request rate): 2 × P99 of solo times, and LOAD × the two workers' batch-1 capacity."""
    solo = np.array([x for xs in calibration["priors"].values() for x in xs])
    a1, s1 = calibration["latency"]["table"][1]
    batch1 = a1 + s1 * float(solo.mean())
    return 2.0 * float(np.quantile(solo, 0.99)), LOAD * 2.0 / batch1


def load(
    url: str,
    payloads: dict[str, list[dict[str, Any]]],
    slo: float,
    rate: float,
    *,
    duration: float = ROUND_S * ROUNDS,
    seed: int = 7,
) -> list[RequestResult]:
    apps = [AppLoad(name, p, 1.0, slo * 1000.0) for name, p in payloads.items()]
    return asyncio.run(run_load(url, MODEL, apps, rate=rate, duration=duration, seed=seed, progress=False))


def metric_total(url: str, outcome: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf'tessera_serving_requests_total\{{[^}}]*outcome="{outcome}"[^}}]*\}} ([0-9.e+]+)', text)
    assert m is not None, f"no {outcome} series in /metrics"
    return float(m.group(1))


def counted_requests(url: str, expected: int, timeout: float = 30.0) -> float:
    """The gateway's served + missed + dropped count, polled until it reaches `expected` (an answer can
    reach the client a moment before its counter moves) or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        counted = sum(metric_total(url, o) for o in ("slo_met", "slo_missed", "dropped"))
        if counted >= expected or time.monotonic() > deadline:
            return counted
        time.sleep(0.05)


def assert_all_answered(url: str, rs: list[RequestResult]) -> None:
    """Every request got an answer: served, or refused with a reason; none lost in transport."""
    assert rs and all(r.status in ANSWER_STATUSES for r in rs), summarize(rs)
    assert all(r.reason for r in rs if r.status != 200), summarize(rs)
    counted = counted_requests(url, len(rs))
    assert counted == len(rs), (counted, len(rs))


def test_orloj_finishes_more_than_timeout_batching_at_a_tight_slo(
    two_workers: list[str],
    calibration: dict[str, Any],
    app_payloads: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    slo, rate = regime(calibration)
    configs = {
        "orloj": model_config("orloj", two_workers, calibration, slo),
        "timeout": model_config(
            "timeout", two_workers, calibration, slo, timeout={"max_queue_delay_s": slo / 4}
        ),
    }
    results: dict[str, list[RequestResult]] = {"orloj": [], "timeout": []}
    per_round: list[dict[str, float]] = []
    with (
        gateway_process(configs["orloj"], tmp_path) as (orloj, _),
        gateway_process(configs["timeout"], tmp_path) as (timeout, _),
    ):
        urls = {"orloj": orloj, "timeout": timeout}
        # Short alternating rounds (order flipped each round, same arrivals for both) so both policies
        # see the same shared, noisy machine.
        for rnd in range(ROUNDS):
            order = list(urls) if rnd % 2 == 0 else list(reversed(urls))
            rates: dict[str, float] = {}
            for policy in order:
                rs = load(urls[policy], app_payloads, slo, rate, duration=ROUND_S, seed=rnd)
                rates[policy] = summarize(rs)["all"]["finish_rate"]
                results[policy] += rs
            per_round.append(rates)
        for policy, url in urls.items():
            assert_all_answered(url, results[policy])
    rates = {p: summarize(rs)["all"]["finish_rate"] for p, rs in results.items()}
    detail = {p: format_summary(summarize(rs)) for p, rs in results.items()}
    print(f"\nslo {slo * 1000:.0f} ms, rate {rate:.1f}/s, finish rates {rates}, rounds {per_round}")
    assert rates["orloj"] >= rates["timeout"] + MARGIN, (rates, per_round, slo, rate, detail)
    assert rates["orloj"] > 0.6, (rates, detail)


def kill_on(
    marker: bytes,
    demo_model: Path,
    calibration: dict[str, Any],
    app_payloads: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
    *,
    load_scale: float = 1.0,
    **extra: Any,
) -> list[RequestResult]:
    """Load two workers (``load_scale`` × the regime's rate) for 1 s, then in 0.5 s rounds until the gateway
    sends the second worker ``marker`` and the worker is killed (SIGKILL) on it, then 1.5 s more. Checks
    that every request was answered, that the survivor serves the last second, and that the gateway counts
    one healthy worker; returns every result."""
    slo, rate = regime(calibration)
    rate *= load_scale
    with (
        worker_process(demo_model, pace=PACE) as (a, _),
        worker_process(demo_model, pace=PACE) as (b, victim),
        tripwire(b, marker, victim.kill) as wire,
    ):
        cfg = model_config("orloj", [a, wire.url], calibration, slo, **extra)
        with gateway_process(cfg, tmp_path) as (url, _):
            results = load(url, app_payloads, slo, rate, duration=1.0)
            wire.arm()
            for rnd in range(20):
                results += load(url, app_payloads, slo, rate, duration=0.5, seed=100 + rnd)
                if wire.fired:
                    break
            assert wire.fired, f"in 10 s the gateway sent the second worker no {marker!r}"
            after = load(url, app_payloads, slo, rate, duration=1.5, seed=200)
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as r:
                assert r.status == 200  # the surviving worker keeps the model ready
            with urllib.request.urlopen(f"{url}/stats", timeout=5) as r:
                stats = json.load(r)["models"][MODEL]
        assert victim.poll() is not None
    results += after
    assert all(r.status in ANSWER_STATUSES for r in results), summarize(results)
    assert all(r.reason for r in results if r.status != 200)
    last = [r for r in after if r.sent_at > 0.5]
    assert last and sum(r.status == 200 for r in last) >= 0.3 * len(last), summarize(last)
    assert stats["healthy_workers"] == 1, stats
    return results


def hit_by_the_kill(results: list[RequestResult]) -> list[RequestResult]:
    return [r for r in results if r.retries > 0 or r.reason == "worker-failed"]


def test_killing_a_worker_mid_batch_retries_or_fails_its_requests_and_service_continues(
    demo_model: Path,
    calibration: dict[str, Any],
    app_payloads: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    results = kill_on(b'"solo":false', demo_model, calibration, app_payloads, tmp_path)
    # The batch the victim was running is re-queued (and then served or dropped) or failed with a reason.
    assert hit_by_the_kill(results), summarize(results)


def test_killing_a_worker_mid_probe_fails_no_request_and_service_continues(
    demo_model: Path,
    calibration: dict[str, Any],
    app_payloads: dict[str, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    """A worker killed while it re-runs finished requests alone for Orloj's profiler: no client request was
    on it, so none is retried or failed; the gateway only stops routing to it. (When the test above killed
    its worker at a fixed time, it once found no request hit in CI; a kill mid-probe is one way to that.)"""
    # Probes run on a worker the scheduler left idle, so the load is half the regime's (0.6 × the workers'
    # capacity) and every finished request is sampled, within a tenth of the workers' time (twice the
    # default share): a probe soon runs on the victim.
    profiler = {"sample_rate": 1.0, "max_share": 0.1}
    results = kill_on(
        b'"solo":true', demo_model, calibration, app_payloads, tmp_path, load_scale=0.5, profiler=profiler
    )
    assert not hit_by_the_kill(results), summarize(hit_by_the_kill(results))


async def _infer_all(url: str, bodies: list[dict[str, Any]], gap_s: float) -> list[tuple[int, Any]]:
    """Send every body ``gap_s`` apart without waiting for answers; (status, JSON answer) of each."""
    async with aiohttp.ClientSession() as session:

        async def one(i: int, body: dict[str, Any]) -> tuple[int, Any]:
            await asyncio.sleep(i * gap_s)
            async with session.post(
                f"{url}/v2/models/{MODEL}/infer", json=body, headers={HEADER_APP: "static"}
            ) as resp:
                return resp.status, await resp.json(content_type=None)

        return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies))))


def test_symphony_batches_across_both_workers_and_answers_every_request_correctly(
    two_workers: list[str], tmp_path: Path
) -> None:
    """Symphony (Symphony §3.1-3.2) on a static model: every request of a fixed-cost mix is
    answered, the outputs are the model's, and batches go to both workers."""
    layers = 20
    bodies = payloads("short", 120, seed=5)
    for b in bodies:  # one cost for all: a static model in Symphony's sense
        b["inputs"][1]["data"] = [layers]
    solo = PACE["unit_ms"] / 1000.0 * layers
    # ℓ(b) = α·b + β from the modelled cost solo·(1 + growth·(b − 1)), plus a few ms for the round trip.
    alpha = solo * PACE["growth"]
    beta = solo - alpha + 0.005
    cfg = model_config(
        "symphony", two_workers, {}, 0.15, symphony={"alpha": alpha, "beta": beta}, max_batch=8
    )
    with gateway_process(cfg, tmp_path) as (url, _):
        # 200 requests/s: twice what two workers sustain one request at a time, so only batching keeps up.
        answers = asyncio.run(_infer_all(url, bodies, 0.005))
        counted = counted_requests(url, len(bodies))
    assert counted == len(bodies)
    assert all(status in ANSWER_STATUSES for status, _ in answers), answers
    assert all(a.get("reason") for status, a in answers if status != 200)
    served = [(b, a) for b, (status, a) in zip(bodies, answers, strict=True) if status == 200]
    assert len(served) >= 0.9 * len(bodies), [a for s, a in answers if s != 200][:5]
    for body, answer in served:
        x = np.asarray(body["inputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
        (out,) = answer["outputs"]
        assert out["name"] == "y" and out["shape"] == [1, WIDTH] and out["datatype"] == "FP32"
        want = early_exit_reference(x, np.array([[layers]]), width=WIDTH)
        np.testing.assert_allclose(np.asarray(out["data"]).reshape(1, WIDTH), want, rtol=1e-3, atol=1e-3)
    params = [a["parameters"] for _, a in served]
    assert {p["tessera_worker"] for p in params} == {0, 1}
    assert max(p["tessera_batch_size"] for p in params) > 1
    assert sum(p["tessera_slo_met"] for p in params) >= 0.8 * len(bodies)
