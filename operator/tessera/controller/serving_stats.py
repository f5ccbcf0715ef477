"""What a ModelDeployment's gateway measured: goodput, SLO attainment and worker idleness over a window.

The gateway counts since it started (``GET /stats``, tessera.gateway.server): answers per model by outcome
(``slo_met``, ``slo_missed``, ``dropped``, ``rejected``) and the seconds its workers reported computing,
with its instance id and its monotonic uptime. The operator reads it on the ModelDeployment timer, at most
every ``serving_stats_interval_s``, and takes rates from the difference of two reads of the same instance:

* goodput = Δslo_met / Δuptime (requests/s answered within their SLO);
* attainment = Δslo_met / (Δslo_met + Δslo_missed + Δdropped), in %; a request the model refused as bad
  input (``rejected``, a 4xx) is the caller's error and counts on neither side; no request in the window:
  unknown (not 100 %);
* idle = 1 − Δbusy / (Δuptime · workers), in %: the share of the window the model's workers spent neither
  running a batch nor a profiling run, by the compute time the workers report for them.

goodput / attainment is then the offered load that Symphony's replica rule follows
(tessera.controller.serving.desired_replicas). A read of another instance (the gateway restarted, e.g. on
a new config) or counters that went back start a new baseline: no window spans two gateways.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

OUTCOMES = ("slo_met", "slo_missed", "dropped", "rejected")
FETCH_TIMEOUT_S = 2.0


class StatsError(Exception):
    """The gateway could not be read, or answered something that is not its counters; says why."""


@dataclass(frozen=True, slots=True)
class Counters:
    """One read of one model's counters at the gateway."""

    instance: str
    uptime_s: float
    met: int
    missed: int
    dropped: int
    rejected: int
    busy_s: float
    workers: int

    @classmethod
    def parse(cls, doc: object, model: str) -> Counters:
        """The counters of ``model`` in a ``GET /stats`` answer (raises StatsError on any other shape)."""
        if not isinstance(doc, Mapping):
            raise StatsError("the gateway's stats are not a JSON object")
        try:
            m = doc["models"][model]
            req = m["requests"]
            out = cls(
                instance=str(doc["instance"]),
                uptime_s=_number(doc["uptime_s"]),
                met=int(req.get("slo_met", 0)),
                missed=int(req.get("slo_missed", 0)),
                dropped=int(req.get("dropped", 0)),
                rejected=int(req.get("rejected", 0)),
                busy_s=_number(m.get("busy_seconds", 0.0)),
                workers=int(m["workers"]),
            )
        except KeyError as err:
            if isinstance(doc.get("models"), Mapping) and model not in doc["models"]:
                raise StatsError(f"the gateway does not serve model {model!r}") from None
            raise StatsError(f"the gateway's stats lack {err}") from None
        except (TypeError, ValueError, AttributeError):
            raise StatsError("the gateway's stats are not a counters document") from None
        if min(out.met, out.missed, out.dropped, out.rejected, out.workers) < 0 or out.uptime_s < 0:
            raise StatsError("the gateway's stats hold negative counters")
        return out


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(v)
    return float(v)


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Rates between two reads of one gateway instance."""

    seconds: float
    requests: int  # answered, less the model's own rejections
    goodput_rps: float
    attainment_percent: float | None  # None: no request finished in the window
    idle_percent: float | None  # None: no worker configured

    def status(self) -> dict[str, Any]:
        """The ModelDeployment status fields (camelCase); None removes a field in a merge patch."""
        return {
            "goodputRps": round(self.goodput_rps, 3),
            "sloAttainmentPercent": (
                round(self.attainment_percent, 2) if self.attainment_percent is not None else None
            ),
            "gpuIdlePercent": round(self.idle_percent, 2) if self.idle_percent is not None else None,
            "statsWindowSeconds": round(self.seconds, 3),
            "statsRequests": self.requests,
        }


def window(prev: Counters, cur: Counters) -> WindowStats | None:
    """Rates from ``prev`` to ``cur``; None when they do not describe one gateway's counting (another
    instance, or time or counters that went back) or the window has no length."""
    dt = cur.uptime_s - prev.uptime_s
    d_met, d_missed, d_dropped = cur.met - prev.met, cur.missed - prev.missed, cur.dropped - prev.dropped
    if (
        cur.instance != prev.instance
        or dt <= 0
        or min(d_met, d_missed, d_dropped, cur.rejected - prev.rejected) < 0
        or cur.busy_s < prev.busy_s
    ):
        return None
    n = d_met + d_missed + d_dropped
    idle = None
    if cur.workers > 0:
        busy = (cur.busy_s - prev.busy_s) / (dt * cur.workers)
        idle = 100.0 * (1.0 - min(1.0, max(0.0, busy)))
    return WindowStats(dt, n, d_met / dt, 100.0 * d_met / n if n else None, idle)


@dataclass(slots=True)
class Poll:
    """What one due read gave: a window (None while only a baseline is held) or why it failed."""

    stats: WindowStats | None = None
    error: str | None = None


async def fetch_stats(url: str, timeout_s: float = FETCH_TIMEOUT_S) -> object:
    """``GET {url}/stats`` as JSON (raises StatsError naming what went wrong)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(f"{url.rstrip('/')}/stats") as resp,
        ):
            if resp.status != 200:
                raise StatsError(f"GET {url}/stats answered HTTP {resp.status}")
            return await resp.json(content_type=None)
    except TimeoutError:
        raise StatsError(f"GET {url}/stats timed out after {timeout_s:g}s") from None
    except aiohttp.ClientError as err:
        raise StatsError(f"GET {url}/stats failed: {type(err).__name__}: {err}") from None
    except ValueError as err:
        raise StatsError(f"GET {url}/stats did not answer JSON: {err}") from None


class StatsReader:
    """Reads each ModelDeployment's gateway at most every ``interval_s`` and keeps the last read as the
    next window's start."""

    def __init__(
        self,
        interval_s: float,
        url_of: Callable[[str, str], str],
        *,
        fetch: Callable[[str], Any] = fetch_stats,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.url_of = url_of
        self._fetch = fetch
        self._clock = clock
        self._last: dict[tuple[str, str], Counters] = {}
        self._read_at: dict[tuple[str, str], float] = {}

    def forget(self, key: tuple[str, str]) -> None:
        self._last.pop(key, None)
        self._read_at.pop(key, None)

    async def poll(self, key: tuple[str, str], model: str) -> Poll | None:
        """A read of ``key``'s gateway if one is due (None: not due yet)."""
        now = self._clock()
        last = self._read_at.get(key)
        if last is not None and now - last < self.interval_s:
            return None
        self._read_at[key] = now
        url = self.url_of(*key)
        try:
            cur = Counters.parse(await self._fetch(url), model)
        except StatsError as err:
            self._last.pop(key, None)  # the next good read is a fresh baseline
            return Poll(error=f"{url}: {err}")
        prev = self._last.get(key)
        self._last[key] = cur
        return Poll(stats=window(prev, cur) if prev is not None else None)
