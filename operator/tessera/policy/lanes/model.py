"""Per-GPU lane model: persistent region, lanes, the safety condition, and Algorithm 2.1 (Salus §2.3).

Memory is in one consistent unit chosen by the caller (MiB in the extender, GB in the paper's examples).

- Safety condition, Eq. 2.1 (Salus §2.3.3): ΣP_i + Σ_l L_l ≤ C, with lane size L_l = max E of its jobs.
- Algorithm 2.1 (Salus §2.3.3): open a new lane; else join the best-matching lane; else grow a lane
  (ascending size); else not found (queue). Gaps in the listing are fixed by default and can be switched off
  (`LaneConfig`) to reproduce the literal listing:
  1. joining also requires ΣP_i + P + ΣL_j ≤ C, otherwise Eq. 2.1 breaks (`join_checks_persistent`);
  2. growing never shrinks a lane: L_r ← max(L_r, E) (`grow_never_shrinks`);
  3. on departure the lane shrinks to the max E of its remaining jobs, an empty lane is deleted
     (auto-defragmentation at the next iteration boundary, §2.3.3); `depart` returns the freed space.
- "Best match" is undefined in the paper; best-fit (smallest L_j ≥ E) is the default, first-fit an option.
- Compute share per lane: the MPS active-thread percentage (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) of the lane.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

BestMatch = Literal["best_fit", "first_fit"]
ComputeMode = Literal["demand", "equal"]
_EPS = 1e-9


class LaneModelError(ValueError):
    """Bad input to the lane model (negative sizes, unknown or duplicate job)."""


@dataclass(frozen=True)
class LaneConfig:
    """Choices the paper leaves open or gets wrong; defaults are the spec's recommended fixes."""

    # Alg. 2.1 as printed lets steps 4-6 join a lane without checking that the new job's P still fits, which
    # breaks Eq. 2.1; True adds that check (Σ P_i + P + Σ L_j ≤ C).
    join_checks_persistent: bool = True
    # Step 9 as printed can shrink a lane (L_r ← E); True keeps L_r ← max(L_r, E), a lane being its jobs' max E.
    grow_never_shrinks: bool = True
    best_match: BestMatch = "best_fit"
    compute_mode: ComputeMode = "demand"  # lane share = its jobs' max demand, scaled to fit 100%
    min_compute_percent: int = 1
    # Cap on lanes per GPU (None: only memory limits them). Step 1 opens a lane whenever one fits, which
    # reserves ephemeral room that later jobs' persistent memory then lacks; a cap makes them join instead.
    max_lanes: int | None = None

    def __post_init__(self) -> None:
        if self.max_lanes is not None and self.max_lanes < 1:
            raise LaneModelError(f"max_lanes must be >= 1 or None, got {self.max_lanes}")
        if self.best_match not in ("best_fit", "first_fit"):
            raise LaneModelError(f"best_match must be 'best_fit' or 'first_fit', got {self.best_match!r}")
        if self.compute_mode not in ("demand", "equal"):
            raise LaneModelError(f"compute_mode must be 'demand' or 'equal', got {self.compute_mode!r}")


@dataclass(frozen=True)
class LaneJob:
    """A job's memory needs: P = persistent (model + framework-internal), E = ephemeral peak per iteration."""

    job_id: str
    persistent: float
    ephemeral: float
    compute_percent: int | None = None  # declared share of SMs, if any

    def __post_init__(self) -> None:
        if self.persistent < 0 or self.ephemeral < 0:
            raise LaneModelError(f"job {self.job_id!r}: persistent and ephemeral memory must be >= 0")
        if self.compute_percent is not None and not 1 <= self.compute_percent <= 100:
            raise LaneModelError(
                f"job {self.job_id!r}: compute_percent must be in 1..100, got {self.compute_percent}"
            )


@dataclass
class Lane:
    lane_id: str
    size: float
    jobs: dict[str, LaneJob] = field(default_factory=dict)

    def max_ephemeral(self) -> float:
        return max((j.ephemeral for j in self.jobs.values()), default=0.0)


@dataclass(frozen=True)
class Admission:
    """Where Algorithm 2.1 put a job: `step` is 'new', 'join' or 'grow'."""

    lane_id: str
    step: Literal["new", "join", "grow"]


class GpuLanes:
    """One GPU's lanes under Eq. 2.1. `admit` runs Algorithm 2.1; `depart` shrinks and reclaims."""

    def __init__(
        self, capacity: float, config: LaneConfig | None = None, *, lane_prefix: str = "lane"
    ) -> None:
        if capacity <= 0:
            raise LaneModelError(f"GPU memory capacity must be positive, got {capacity}")
        self.capacity = float(capacity)
        self.config = config or LaneConfig()
        self.lanes: dict[str, Lane] = {}
        self._job_lane: dict[str, str] = {}
        self._persistent: dict[str, float] = {}
        self._prefix = lane_prefix
        self._next = 1

    # -- views ------------------------------------------------------------------------------------
    def sum_persistent(self) -> float:
        return sum(self._persistent.values())

    def sum_lanes(self) -> float:
        return sum(lane.size for lane in self.lanes.values())

    def slack(self) -> float:
        """C − ΣP − ΣL; never negative while the errata fixes are on."""
        return self.capacity - self.sum_persistent() - self.sum_lanes()

    def is_safe(self) -> bool:
        """Eq. 2.1 with lane size recomputed as max E of its jobs (no stale sizes)."""
        lanes = sum(lane.max_ephemeral() for lane in self.lanes.values())
        return self.sum_persistent() + lanes <= self.capacity + _EPS

    def lane_of(self, job_id: str) -> str:
        try:
            return self._job_lane[job_id]
        except KeyError:
            raise LaneModelError(f"job {job_id!r} is not on this GPU") from None

    def jobs(self) -> list[str]:
        return list(self._job_lane)

    # -- Algorithm 2.1 ----------------------------------------------------------------------------
    def find_lane(self, job: LaneJob) -> Admission | None:
        """Algorithm 2.1 without side effects: where `job` would go, or None (it must queue)."""
        p_sum = self.sum_persistent() + job.persistent
        l_sum = self.sum_lanes()
        c, e = self.capacity, job.ephemeral
        # Steps 1-3: a new lane of size E.
        room_for_lane = self.config.max_lanes is None or len(self.lanes) < self.config.max_lanes
        if room_for_lane and p_sum + l_sum + e <= c + _EPS:
            return Admission(self._peek_lane_id(), "new")
        # Steps 4-6: join a lane already ≥ E (only while everyone's P still fits: the check Alg. 2.1 omits).
        if not self.config.join_checks_persistent or p_sum + l_sum <= c + _EPS:
            fits = [lane for lane in self.lanes.values() if lane.size >= e - _EPS]
            if fits:
                if self.config.best_match == "best_fit":
                    chosen = min(fits, key=lambda lane: (lane.size, self._order(lane)))
                else:
                    chosen = min(fits, key=self._order)
                return Admission(chosen.lane_id, "join")
        # Steps 7-10: grow the smallest lane that keeps Eq. 2.1 once its size becomes E.
        for lane in sorted(self.lanes.values(), key=lambda lane: (lane.size, self._order(lane))):
            new_size = max(lane.size, e) if self.config.grow_never_shrinks else e
            if p_sum + l_sum - lane.size + new_size <= c + _EPS:
                return Admission(lane.lane_id, "grow")
        return None  # step 11: not found → the session queues

    def admit(self, job: LaneJob) -> Admission | None:
        """Run Algorithm 2.1 and place `job`; None means not found (queue and retry after a departure)."""
        if job.job_id in self._job_lane:
            raise LaneModelError(
                f"job {job.job_id!r} is already on this GPU (lane {self._job_lane[job.job_id]})"
            )
        where = self.find_lane(job)
        if where is None:
            return None
        if where.step == "new":
            lane = Lane(self._take_lane_id(), job.ephemeral)
            self.lanes[lane.lane_id] = lane
        else:
            lane = self.lanes[where.lane_id]
            if where.step == "grow":
                lane.size = max(lane.size, job.ephemeral) if self.config.grow_never_shrinks else job.ephemeral
        lane.jobs[job.job_id] = job
        self._job_lane[job.job_id] = lane.lane_id
        self._persistent[job.job_id] = job.persistent
        return Admission(lane.lane_id, where.step)

    def depart(self, job_id: str) -> float:
        """Remove a job; its lane shrinks to the max E left (deleted when empty). Returns memory freed."""
        lane = self.lanes[self.lane_of(job_id)]
        before = self.sum_persistent() + self.sum_lanes()
        del lane.jobs[job_id]
        del self._job_lane[job_id]
        del self._persistent[job_id]
        if lane.jobs:
            lane.size = lane.max_ephemeral()
        else:
            del self.lanes[lane.lane_id]
        return before - self.sum_persistent() - self.sum_lanes()

    def admit_queued(self, queue: list[LaneJob]) -> list[tuple[LaneJob, Admission]]:
        """Retry queued sessions in order after an event (Algorithm 2.1, Salus §2.3.3, which leaves the retry order open); returns who got in."""
        placed = []
        for job in list(queue):
            where = self.admit(job)
            if where is not None:
                queue.remove(job)
                placed.append((job, where))
        return placed

    # -- compute share per lane -------------------------------------------------------------------
    def compute_shares(self) -> dict[str, int]:
        """MPS active-thread percent per lane.

        'demand': a lane needs the largest declared share among its jobs (one iteration runs at a time, like
        L_l = max E); lanes with no declaration split what is left equally; all are scaled down together if
        they would exceed 100. 'equal': 100 / number of lanes. Never below `min_compute_percent`.
        """
        if not self.lanes:
            return {}
        floor = self.config.min_compute_percent
        if self.config.compute_mode == "equal":
            share = max(floor, 100 // len(self.lanes))
            return dict.fromkeys(self.lanes, share)
        declared: dict[str, int] = {}
        for lane in self.lanes.values():
            wants = [j.compute_percent for j in lane.jobs.values() if j.compute_percent is not None]
            if wants:
                declared[lane.lane_id] = max(wants)
        total = sum(declared.values())
        scale = min(1.0, 100.0 / total) if total else 1.0
        shares = {lid: max(floor, math.floor(v * scale)) for lid, v in declared.items()}
        rest = [lid for lid in self.lanes if lid not in declared]
        if rest:
            left = max(0, 100 - sum(shares.values()))
            for lid in rest:
                shares[lid] = max(floor, left // len(rest))
        return {lid: shares[lid] for lid in self.lanes}

    # -- internals --------------------------------------------------------------------------------
    def _order(self, lane: Lane) -> int:
        return int(lane.lane_id.rsplit("-", 1)[-1]) if lane.lane_id.rsplit("-", 1)[-1].isdigit() else 0

    def _peek_lane_id(self) -> str:
        return f"{self._prefix}-{self._next}"

    def _take_lane_id(self) -> str:
        lane_id = self._peek_lane_id()
        self._next += 1
        return lane_id
