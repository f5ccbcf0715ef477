"""Opt-in cooperative throttle for best-effort PyTorch jobs that share a GPU with a high-priority lane.

Orion throttles best-effort (BE) work per kernel by intercepting CUDA launches (Orion §5.1.1). Without
interception, a BE job can do the same at module granularity:
- before each module's forward pass it checks the node's HP-busy signal (a flag file the node agent publishes,
  path in `TESSERA_HP_BUSY_FILE`);
- while the HP lane is busy it waits until the expected duration of its own outstanding GPU work is within
  DUR_THRESHOLD (2.5% of the HP request latency by default);
- while the HP lane is idle it only bounds how many modules it has queued.
The decision is `tessera.policy.orion.cooperative.ThrottleRule`, the one the simulator runs.

Outstanding work is tracked with `torch.cuda.Event` when torch and CUDA are available: one event is recorded
after each module and polled with the non-blocking `query()`. Anything with `record() -> marker` and
`marker.query() -> bool` can stand in, so the logic runs and is tested without torch.

    from tessera.throttle import CooperativeThrottle
    throttle = CooperativeThrottle.from_env(hp_latency_s=0.0064, module_cost_s=2e-4)
    throttle.attach(model)          # forward pre-hooks and hooks on the model's leaf modules

It cannot match compute/memory profiles per kernel as Orion does; see docs/results-orion.md for what the
throttle adds beside MPS caps in the model (nothing measurable there) and docs/node-agent.md for the lanes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tessera.api import contract
from tessera.policy.orion.cooperative import ThrottleRule


class Marker(Protocol):
    def query(self) -> bool: ...


class EventSource(Protocol):
    def record(self) -> Marker: ...


class HpBusy(Protocol):
    def busy(self) -> bool: ...


@dataclass
class FileHpBusy:
    """The agent's flag file: busy while it exists and starts with "1". A missing file reads as idle."""

    path: Path

    def busy(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                return f.read(1) == b"1"
        except OSError:
            return False


class NeverBusy:
    def busy(self) -> bool:
        return False


class TorchCudaEvents:
    """`torch.cuda.Event` on the current stream (imported lazily: torch is optional)."""

    def __init__(self) -> None:
        import torch  # type: ignore[import-not-found]

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda is not available; pass another event source")
        self._torch = torch

    def record(self) -> Marker:
        ev = self._torch.cuda.Event()
        ev.record()
        return ev  # type: ignore[no-any-return]


@dataclass
class CooperativeThrottle:
    rule: ThrottleRule
    hp: HpBusy
    events: EventSource
    module_cost_s: float | Mapping[str, float] = 2e-4  # expected GPU time of a module (from BE profiling)
    poll_s: float = 20e-6
    max_wait_s: float = (
        1.0  # never wait longer than this for one module (a lost event must not hang training)
    )
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    outstanding: deque[tuple[Marker, float]] = field(default_factory=deque)
    waits: int = 0  # modules that had to wait
    waited_s: float = 0.0
    timeouts: int = 0

    def cost(self, name: str) -> float:
        if isinstance(self.module_cost_s, Mapping):
            return float(self.module_cost_s.get(name, self.module_cost_s.get("*", 2e-4)))
        return float(self.module_cost_s)

    def _drain(self) -> None:
        """Drop completed work from the front (events complete in stream order)."""
        while self.outstanding and self.outstanding[0][0].query():
            self.outstanding.popleft()

    def _may_launch(self) -> bool:
        self._drain()
        return self.rule.may_launch(
            self.hp.busy(), sum(c for _, c in self.outstanding), len(self.outstanding)
        )

    def before(self, name: str = "") -> None:
        """Call before a module launches its kernels: returns once the rule allows it."""
        if self._may_launch():
            return
        start = self.clock()
        self.waits += 1
        while not self._may_launch():
            if self.clock() - start >= self.max_wait_s:
                self.timeouts += 1
                break
            self.sleep(self.poll_s)
        self.waited_s += self.clock() - start

    def after(self, name: str = "") -> None:
        """Call after a module launched its kernels: records an event that completes with them."""
        self.outstanding.append((self.events.record(), self.cost(name)))

    def attach(self, model: Any, *, leaves_only: bool = True) -> list[Any]:
        """Register forward pre-hooks and hooks on `model`'s modules (torch.nn.Module API); returns handles."""
        handles = []
        for name, module in model.named_modules():
            if leaves_only and any(True for _ in module.children()):
                continue
            handles.append(module.register_forward_pre_hook(lambda m, args, n=name: self.before(n)))
            handles.append(module.register_forward_hook(lambda m, args, out, n=name: self.after(n)))
        return handles

    @classmethod
    def from_env(
        cls,
        hp_latency_s: float,
        *,
        fraction: float = 0.025,
        module_cost_s: float | Mapping[str, float] = 2e-4,
        events: EventSource | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CooperativeThrottle:
        """The throttle for this pod: HP-busy flag from `TESSERA_HP_BUSY_FILE` (never busy when unset),
        CUDA events unless `events` is given."""
        env = os.environ if env is None else env
        path = env.get(contract.ENV_HP_BUSY_FILE)
        hp: HpBusy = FileHpBusy(Path(path)) if path else NeverBusy()
        return cls(
            ThrottleRule.for_hp_latency(hp_latency_s, fraction),
            hp,
            events if events is not None else TorchCudaEvents(),
            module_cost_s,
        )
