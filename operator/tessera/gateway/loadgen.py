"""Open-loop load generator for a v2 inference endpoint: Poisson or Gamma arrivals (the simulator's
:mod:`tessera.sim.serving.arrivals`), a weighted mix of applications with their own deadlines, and the
finish rate — answers on time within the request's deadline over requests sent — with latency
percentiles. Every request sent is accounted for: answered, refused with a reason, or failed in transport.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, RootModel

from tessera.api.contract import HEADER_APP, HEADER_DEADLINE_MS
from tessera.api.safe_load import InputError, load_json_file, validated
from tessera.gateway.protocol import dumps, loads
from tessera.progress import Progress
from tessera.sim.serving.arrivals import gamma_arrivals


@dataclass(frozen=True)
class AppLoad:
    """One application of the mix: its share of requests, latency budget and request bodies to pick from."""

    name: str
    payloads: Sequence[dict[str, Any]]
    weight: float = 1.0
    deadline_ms: float | None = None  # None: the gateway's per-model SLO

    def __post_init__(self) -> None:
        if not self.payloads:
            raise ValueError(f"application {self.name!r} has no request payloads")
        if not self.weight > 0:
            raise ValueError(f"application {self.name!r}: weight must be > 0, got {self.weight}")
        if self.deadline_ms is not None and not self.deadline_ms > 0:
            raise ValueError(f"application {self.name!r}: deadline must be > 0 ms, got {self.deadline_ms}")


@dataclass(frozen=True)
class RequestResult:
    app: str
    sent_at: float  # seconds since the run started
    status: int  # HTTP status; 0 when the request failed in transport
    latency: float  # seconds from send to answer
    on_time: bool
    reason: str | None = None
    retries: int = 0  # times the gateway re-queued it after a worker failure
    # From a 200 answer's parameters: the gateway's own time on the request, and the round trip to the
    # worker that ran it (seconds; None when the answer does not say).
    overhead_s: float | None = None
    worker_s: float | None = None


class _Payload(BaseModel):
    """A v2 inference request body, as far as the generator looks: the server checks the tensors."""

    model_config = ConfigDict(extra="allow")
    inputs: list[dict[str, Any]] = Field(min_length=1)


class _Payloads(RootModel[list[_Payload]]):
    root: list[_Payload] = Field(min_length=1)


def load_payloads(path: str | Path) -> list[dict[str, Any]]:
    """A JSON file holding one v2 request body or a list of them; a ValueError of one line naming the file
    and the field (`[2].inputs: required field is missing`) otherwise."""
    try:
        data = load_json_file(path)
        validated(_Payloads if isinstance(data, list) else _Payload, data, str(path))
    except InputError as err:
        raise ValueError(f"request payloads {err}") from None
    items: list[dict[str, Any]] = data if isinstance(data, list) else [data]
    return items


def arrival_times(
    rate: float, rng: np.random.Generator, *, duration: float | None, count: int | None, cv: float = 1.0
) -> np.ndarray:
    """Send times (s) for ``duration`` seconds or the first ``count`` arrivals; CV 1 is Poisson."""
    if (duration is None) == (count is None):
        raise ValueError("give exactly one of a duration or a request count")
    if duration is not None:
        return gamma_arrivals(rate, cv, duration, rng)
    assert count is not None
    if count < 1:
        raise ValueError(f"request count must be >= 1, got {count}")
    horizon = count / rate
    while True:
        t = gamma_arrivals(rate, cv, horizon * 1.5 + 1.0, rng)
        if t.size >= count:
            return t[:count]
        horizon *= 2


def _plan(
    apps: Sequence[AppLoad], rng: np.random.Generator, times: np.ndarray
) -> tuple[list[int], list[bytes]]:
    """For each send time, the application sending and the request body (a payload of that
    application drawn at random). Each payload is written to JSON once, so the generator's own cost
    stays small next to the server's."""
    weights = np.array([a.weight for a in apps], dtype=np.float64)
    picks = rng.choice(len(apps), size=times.size, p=weights / weights.sum()).tolist()
    encoded: dict[tuple[int, int], bytes] = {}
    bodies: list[bytes] = []
    for i in picks:
        j = int(rng.integers(len(apps[i].payloads)))
        if (i, j) not in encoded:
            encoded[(i, j)] = dumps(apps[i].payloads[j])
        bodies.append(encoded[(i, j)])
    return picks, bodies


async def _send(
    session: aiohttp.ClientSession, endpoint: str, app: AppLoad, body: bytes, at: float
) -> RequestResult:
    """One request, timed from send to answer; a transport failure is a result with status 0."""
    headers = {HEADER_APP: app.name, "Content-Type": "application/json"}
    if app.deadline_ms is not None:
        headers[HEADER_DEADLINE_MS] = f"{app.deadline_ms:g}"
    t0 = time.perf_counter()
    status, reason, slo_header, retries = 0, None, None, 0
    overhead: float | None = None
    worker: float | None = None
    try:
        async with session.post(endpoint, data=body, headers=headers) as resp:
            status = resp.status
            slo_header = resp.headers.get("x-tessera-slo")
            data = loads(await resp.read())
            if status != 200:
                reason = str(data.get("reason") or data.get("error")) if isinstance(data, dict) else None
                retries = int(data.get("retries", 0)) if isinstance(data, dict) else 0
            elif isinstance(data, dict):
                params = data.get("parameters") or {}
                retries = int(params.get("tessera_retries", 0))
                overhead = params.get("tessera_overhead_seconds")
                worker = params.get("tessera_worker_seconds")
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        reason = f"transport: {type(err).__name__}: {err}"
    lat = time.perf_counter() - t0
    if app.deadline_ms is not None:
        on_time = status == 200 and lat <= app.deadline_ms / 1000.0
    else:
        on_time = status == 200 and slo_header == "met"
    return RequestResult(app.name, at, status, lat, on_time, reason, retries, overhead, worker)


async def run_load(
    url: str,
    model: str,
    apps: Sequence[AppLoad],
    *,
    rate: float,
    duration: float | None = None,
    count: int | None = None,
    cv: float = 1.0,
    seed: int = 0,
    timeout_s: float = 60.0,
    progress: bool | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Send requests to ``{url}/v2/models/{model}/infer`` at the arrival times and collect every answer."""
    if not apps:
        raise ValueError("the load needs at least one application")
    rng = np.random.default_rng(seed)
    times = arrival_times(rate, rng, duration=duration, count=count, cv=cv)
    picks, bodies = _plan(apps, rng, times)
    endpoint = f"{url.rstrip('/')}/v2/models/{model}/infer"
    results: list[RequestResult] = []
    bar = Progress(times.size, "loadgen", enabled=progress)

    async def send(session: aiohttp.ClientSession, app: AppLoad, body: bytes, at: float) -> None:
        r = await _send(session, endpoint, app, body, at)
        results.append(r)
        if on_result is not None:
            on_result(r)
        bar.update(len(results))

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        for t, i, body in zip(times.tolist(), picks, bodies, strict=True):
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, apps[i], body, t)))
        await asyncio.gather(*tasks)
    bar.close()
    return results


def _pct(lat: list[float], q: float) -> float | None:
    return float(np.percentile(lat, q)) * 1000.0 if lat else None


def summarize(results: Sequence[RequestResult], elapsed: float | None = None) -> dict[str, Any]:
    """Finish rate and latency percentiles (ms), overall and per application."""

    def block(rs: Sequence[RequestResult]) -> dict[str, Any]:
        ok = [r.latency for r in rs if r.status == 200]
        return {
            "sent": len(rs),
            "answered": len(ok),
            "on_time": sum(r.on_time for r in rs),
            "finish_rate": sum(r.on_time for r in rs) / len(rs) if rs else math.nan,
            "errors": dict(Counter(r.reason or f"http-{r.status}" for r in rs if r.status != 200)),
            "latency_ms": {"p50": _pct(ok, 50), "p90": _pct(ok, 90), "p99": _pct(ok, 99)},
        }

    out = {
        "all": block(results),
        "apps": {a: block([r for r in results if r.app == a]) for a in sorted({r.app for r in results})},
    }
    if elapsed:
        out["all"]["throughput_rps"] = len(results) / elapsed
    return out


def format_summary(summary: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = [
        f"{'app':<12}{'sent':>7}{'on time':>9}{'finish':>8}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}  errors"
    ]
    rows = [("all", summary["all"]), *summary["apps"].items()]
    for name, b in rows:
        lat = b["latency_ms"]
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(b["errors"].items())) or "-"
        lines.append(
            f"{name:<12}{b['sent']:>7}{b['on_time']:>9}{b['finish_rate']:>8.3f}"
            f"{ms(lat['p50']):>9}{ms(lat['p90']):>9}{ms(lat['p99']):>9}  {errs}"
        )
    return "\n".join(lines)
