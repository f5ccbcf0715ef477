"""What the scale bench measures, apart from the cluster it runs: processes' CPU and memory from /proc,
Prometheus text (histogram quantiles as Prometheus interpolates them), and the bind record of a replay
(pods bound per second while a backlog waits, creation → bound latency)."""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# --- processes -------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/<pid>/stat), 0 where /proc cannot say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    """A process's resident memory (`VmRSS`) or its peak (`VmHWM`) in MiB; 0 where /proc cannot say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Usage:
    """CPU seconds and peak RSS of named processes over a window, sampled while it runs (the peak of a
    process that lives longer than the window is the highest sample, not its lifetime high-water mark)."""

    pids: dict[str, int]
    start: dict[str, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def begin(self) -> None:
        self.start = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self.peak = {k: rss_mib(p) for k, p in self.pids.items()}

    def sample(self) -> None:
        for k, p in self.pids.items():
            self.peak[k] = max(self.peak.get(k, 0.0), rss_mib(p))

    def end(self) -> None:
        self.sample()
        self.cpu = {k: cpu_seconds(p) - self.start.get(k, 0.0) for k, p in self.pids.items()}


# --- Prometheus text -------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            out.append((labels, float(m.group(3))))
    return out


def buckets(text: str, name: str, **match: str) -> dict[float, float]:
    """Cumulative bucket counts of a histogram, summed over the series whose labels include `match`."""
    out: dict[float, float] = defaultdict(float)
    for labels, value in samples(text, name + "_bucket"):
        if all(labels.get(k) == v for k, v in match.items()):
            out[float(labels["le"])] += value
    return dict(out)


def minus(after: Mapping[float, float], before: Mapping[float, float]) -> dict[float, float]:
    """The observations made between two scrapes of the same histogram."""
    return {le: n - before.get(le, 0.0) for le, n in after.items()}


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th observation."""
    les = sorted(cumulative)
    if not les or cumulative[les[-1]] <= 0:
        return None
    rank = q * cumulative[les[-1]]
    prev_le, prev_n = 0.0, 0.0
    for le in les:
        n = cumulative[le]
        if n >= rank:
            if math.isinf(le):
                return prev_le  # beyond the largest finite bound: Prometheus answers that bound
            if n == prev_n:
                return le
            return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return les[-1]


def total(cumulative: Mapping[float, float]) -> float:
    return max(cumulative.values(), default=0.0)


# --- the bind record of a replay -------------------------------------------------------------------------


@dataclass
class Replay:
    """When each pod was created (the create call answered) and bound (the watch first showed a node), in
    this process's monotonic clock."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    unschedulable: set[str] = field(default_factory=set)
    first: float = field(default_factory=time.monotonic)

    def latencies(self) -> list[float]:
        return sorted(self.bound[n] - self.created[n] for n in self.bound if n in self.created)

    def backlog_at(self, t: float) -> int:
        made = sum(1 for c in self.created.values() if c <= t)
        done = sum(1 for b in self.bound.values() if b <= t)
        return made - done

    def sustained(self, window_s: float = 5.0, min_backlog: int = 20) -> float | None:
        """Median binds per second over the windows that began with at least `min_backlog` pods waiting
        (the scheduler, not the arrivals, set the pace there); None when no backlog ever built."""
        if not self.bound:
            return None
        start, end = min(self.created.values()), max(self.bound.values())
        binds = sorted(self.bound.values())
        rates = []
        t = start
        while t + window_s <= end:
            if self.backlog_at(t) >= min_backlog:
                rates.append(sum(1 for b in binds if t <= b < t + window_s) / window_s)
            t += window_s
        return statistics.median(rates) if rates else None

    def overall(self) -> float:
        """Pods bound per second from the first create to the last bind."""
        if not self.bound:
            return 0.0
        span = max(self.bound.values()) - min(self.created.values())
        return len(self.bound) / span if span > 0 else 0.0


def percentile(values: Iterable[float], q: float) -> float | None:
    vals = sorted(values)
    if not vals:
        return None
    k = min(len(vals) - 1, max(0, math.ceil(q * len(vals)) - 1))
    return vals[k]
