"""Two-level scheduling: Themis leases GPUs to a tuning App, Fluid places its trials inside the lease.

`FluidAppRuntime` implements the training simulator's `AppRuntime` protocol
(tessera.sim.training.runtime) around a `TuningSim`: every lease change becomes `set_pool`, which is
DynamicFluid's cluster-change trigger (Fluid, dissertation §3.4.3); new TrialGroups are
planned with StaticFluid on the idle GPUs of the lease. The same engine with a pool that never changes
is a TrialGroup that owns a fixed set of GPUs (`TuningSim(cluster, pool, …)` directly).

What the arbiter sees (Themis bids, §4.3.1): the App's demand is what Fluid could use,
d GPUs per running or waiting trial (Fluid packs when it gets fewer), capped by `max_gpus`; its remaining time on k GPUs is Fluid's own plan for the live trials on k GPUs — the
water-filling widths' makespan, never below the area bound Σh/k. An adaptive tuner's future trials are
unknown, so total work is the work done plus the live trials' remaining work. While it holds no GPUs the
engine admits trials as if it held `max_gpus` (`TuningSim.idle_capacity_gpus`), so an asynchronous tuner
waiting for its first lease still shows the work it would start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from tessera.cluster import Cluster, Sensitivity
from tessera.policy.fluid import FluidConfig, plan_makespan, water_fill
from tessera.policy.hpo import TuningAlgorithm
from tessera.sim.tuning.engine import Horizon, TrialModel, TuningSim


@dataclass(frozen=True, slots=True)
class LeasePeriod:
    """The App's GPU set from `time` on; placements numbered from `first_placement` on were made in it."""

    time: float
    gpus: frozenset[str]
    first_placement: int


@dataclass
class FluidAppRuntime:
    cluster: Cluster
    trials: TrialModel
    algorithm: TuningAlgorithm
    fluid: FluidConfig = field(default_factory=FluidConfig)
    sensitivity: Sensitivity = field(default_factory=Sensitivity)
    max_gpus: int | None = None  # the App's demand cap (None: the whole cluster)
    horizon: Horizon = "rung"
    start: float = 0.0
    placement_scores: list[float] = field(default_factory=list)
    leases: list[LeasePeriod] = field(default_factory=list)  # every GPU-set change, in order
    sim: TuningSim = field(init=False)
    _scored: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        cap = len(self.cluster) if self.max_gpus is None else self.max_gpus
        if not 1 <= cap <= len(self.cluster):
            raise ValueError(f"max_gpus must lie in [1, {len(self.cluster)}] (the cluster size), got {cap}")
        self.max_gpus = cap
        self.sim = TuningSim(
            self.cluster,
            [],
            self.trials,
            self.algorithm,
            "fluid",
            self.fluid,
            self.sensitivity,
            horizon=self.horizon,
            now=self.start,
            idle_capacity_gpus=cap,
        )

    # --- the lease --------------------------------------------------------------------------------

    def set_gpus(self, now: float, gpus: frozenset[str]) -> None:
        self.advance(now)
        self.leases.append(LeasePeriod(now, frozenset(gpus), len(self.sim.placements)))
        self.sim.set_pool(sorted(gpus))
        self._score_new_placements()

    def advance(self, now: float) -> None:
        if now < self.sim.now - 1e-9 * max(1.0, abs(now)):  # the engine may run a rounding step ahead
            raise ValueError(f"runtime asked to go back in time: {now} < {self.sim.now}")
        self.sim.advance(now)
        self.sim.now = max(self.sim.now, now)  # a finished or idle job still follows the clock
        self._score_new_placements()

    def next_event(self) -> float:
        return self.sim.next_event_time()

    def _score_new_placements(self) -> None:
        for p in self.sim.placements[self._scored :]:
            self.placement_scores.append(1.0 / self.cluster.slowdown(p.gpus, self.sensitivity))
        self._scored = len(self.sim.placements)

    # --- what the arbiter sees ------------------------------------------------------------------------

    def demand(self) -> int:
        if self.done():
            return 0
        assert self.max_gpus is not None
        return min(self.max_gpus, max(1, len(self.sim.live_heights()) * self.fluid.d))

    def peak_demand(self) -> int:
        assert self.max_gpus is not None
        return self.max_gpus

    def total_work(self) -> float:
        return self.sim.work_done() + self.remaining_work(self.sim.now)

    def remaining_work(self, now: float) -> float:
        return sum(h for h, _ in self.sim.live_heights())

    def remaining_time(self, gpus: int, slowdown: float) -> float:
        if gpus <= 0:
            return math.inf
        live = self.sim.live_heights()
        if not live:
            return 0.0
        hs = [h for h, _ in live]
        widths: list[Fraction] = water_fill(hs, gpus, self.fluid.c, self.fluid.d)
        plan = plan_makespan(hs, widths, [m for _, m in live])
        return slowdown * max(plan, sum(hs) / gpus)

    def used_gpus(self) -> frozenset[str]:
        return frozenset(self.sim.used_gpus())

    def done(self) -> bool:
        return self.sim.done()
