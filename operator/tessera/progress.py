"""A dependency-free progress bar for long runs (simulations, benchmarks), written to stderr.

Quiet when stderr is not a terminal unless forced, so CI logs and `--json` output stay clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self,
        total: float,
        label: str = "",
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        min_interval_s: float = 0.2,
    ) -> None:
        self.total = max(float(total), 1e-12)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.min_interval_s = min_interval_s
        self._start = time.monotonic()
        self._last = 0.0
        self.done = 0.0

    def update(self, done: float, note: str = "") -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.min_interval_s and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = now - self._start
        eta = elapsed / frac - elapsed if frac > 0 else float("nan")
        self.stream.write(
            f"\r{self.label} [{bar}] {frac * 100:5.1f}% {elapsed:6.1f}s elapsed, ~{eta:5.1f}s left {note}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.total)
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
