"""Request arrival processes for the serving simulator.

Three sources of arrival times, all returning a sorted ``numpy`` array of seconds:

* :func:`poisson_arrivals` — exponential gaps at a mean rate (AlpaServe §3, Symphony §5).
* :func:`gamma_arrivals` — i.i.d. Gamma gaps with mean rate λ and coefficient of variation CV:
  ``shape = 1/CV²``, ``scale = CV²/λ``; CV = 1 is Poisson (AlpaServe §6, its code's
  ``GammaProcess``). Symphony describes burstiness by the Gamma *shape* k instead; CV = 1/sqrt(k).
* :func:`per_minute_arrivals` — Clockwork/Orloj trace replay: a Poisson process whose rate in each
  interval is ``count / interval × scale`` (Orloj §5, as Clockwork's traces).
* :func:`read_trace` — replay a recorded request trace (CSV or JSON lines with an ``arrival`` column).

Randomness is always a ``numpy.random.Generator`` passed in, so every policy sees the same requests.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def _check_rate_duration(rate: float, duration: float) -> None:
    if not rate > 0:
        raise ValueError(f"arrival rate must be > 0 requests/s, got {rate!r}")
    if not duration > 0:
        raise ValueError(f"arrival duration must be > 0 s, got {duration!r}")


def gamma_arrivals(
    rate: float, cv: float, duration: float, rng: np.random.Generator, *, start: float = 0.0
) -> FloatArray:
    """Arrival times in ``[start, start + duration)`` of a Gamma renewal process.

    The first arrival is at ``start + first gap`` (AlpaServe's ``GammaProcess``).
    """
    _check_rate_duration(rate, duration)
    if not cv > 0:
        raise ValueError(f"arrival CV must be > 0 (1 = Poisson), got {cv!r}")
    shape = 1.0 / (cv * cv)
    scale = cv * cv / rate
    expected = rate * duration
    # Draw in chunks until the horizon is passed; the first chunk nearly always suffices.
    n = int(expected + 6.0 * np.sqrt(expected * max(cv * cv, 1.0)) + 16)
    parts: list[FloatArray] = []
    t = start
    while True:
        gaps = rng.gamma(shape, scale, size=n)
        times = t + np.cumsum(gaps)
        parts.append(times)
        t = float(times[-1])
        if t >= start + duration:
            break
    out = np.concatenate(parts)
    return out[out < start + duration]


def poisson_arrivals(
    rate: float, duration: float, rng: np.random.Generator, *, start: float = 0.0
) -> FloatArray:
    """Poisson arrivals: exponential gaps with mean ``1/rate`` (Gamma with CV = 1)."""
    return gamma_arrivals(rate, 1.0, duration, rng, start=start)


def uniform_arrivals(rate: float, duration: float, *, start: float = 0.0) -> FloatArray:
    """Evenly spaced arrivals (Symphony §3 uses them to explain staggered execution)."""
    _check_rate_duration(rate, duration)
    gap = 1.0 / rate
    return start + gap * np.arange(1, int(np.floor(duration * rate + 1e-9)) + 1, dtype=np.float64)


def cv_from_gamma_shape(shape: float) -> float:
    """Symphony's Γ(k) burstiness as a CV: a Gamma with shape k has CV = 1/sqrt(k)."""
    if not shape > 0:
        raise ValueError(f"Gamma shape must be > 0, got {shape!r}")
    return float(1.0 / np.sqrt(shape))


def per_minute_arrivals(
    counts: Sequence[float],
    rng: np.random.Generator,
    *,
    scale: float = 1.0,
    interval: float = 60.0,
    cv: float = 1.0,
) -> FloatArray:
    """Replay per-interval invocation counts (Azure Functions style) as arrivals.

    Interval ``i`` gets a Gamma process (Poisson when ``cv == 1``) of rate ``counts[i] / interval ×
    scale`` (Orloj §5; Clockwork's replay). ``interval`` may be shorter than 60 s to compress time.
    """
    if scale <= 0 or interval <= 0:
        raise ValueError(f"scale and interval must be > 0, got scale={scale!r} interval={interval!r}")
    parts: list[FloatArray] = []
    for i, c in enumerate(counts):
        if c < 0:
            raise ValueError(f"trace count at interval {i} is negative ({c!r})")
        rate = c / interval * scale
        if rate > 0:
            parts.append(gamma_arrivals(rate, cv, interval, rng, start=i * interval))
    if not parts:
        return np.empty(0, dtype=np.float64)
    return np.concatenate(parts)


@dataclass(frozen=True)
class TraceRecord:
    """One recorded request: arrival time (s), application/model name, and optionally its
    measured execution time (s) and its own SLO (s)."""

    arrival: float
    app: str
    exec_time: float | None = None
    slo: float | None = None


def read_trace(path: str | Path, *, default_app: str = "default") -> list[TraceRecord]:
    """Read a request trace for replay. CSV with a header, or JSON lines (``.jsonl``).

    Columns: ``arrival`` (required, seconds), ``app`` (or ``model``), ``exec_time``, ``slo``.
    Rows are returned sorted by arrival; a malformed row raises ``ValueError`` naming file and line.
    """
    p = Path(path)
    rows: list[dict[str, str]] = []
    if p.suffix in (".jsonl", ".ndjson"):
        with p.open() as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append({k: str(v) for k, v in json.loads(line).items()})
                    except (json.JSONDecodeError, AttributeError) as e:
                        raise ValueError(f"{p}:{n}: not a JSON object: {e}") from e
    else:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or "arrival" not in reader.fieldnames:
                raise ValueError(f"{p}: trace needs a header with an 'arrival' column")
            rows = list(reader)
    out: list[TraceRecord] = []
    for n, row in enumerate(rows, 2):
        try:
            arrival = float(row["arrival"])
            exec_time = float(row["exec_time"]) if row.get("exec_time") not in (None, "") else None
            slo = float(row["slo"]) if row.get("slo") not in (None, "") else None
        except (KeyError, ValueError) as e:
            raise ValueError(f"{p}: row {n}: bad or missing number ({e})") from e
        if arrival < 0 or (exec_time is not None and exec_time <= 0) or (slo is not None and slo <= 0):
            raise ValueError(f"{p}: row {n}: arrival must be >= 0, exec_time and slo > 0")
        app = row.get("app") or row.get("model") or default_app
        out.append(TraceRecord(arrival, app, exec_time, slo))
    out.sort(key=lambda r: r.arrival)
    return out
