"""Replay training jobs on one GPU under a lane policy (Salus §2.5.1, Table 2.1).

Drives the same `GpuLanes` (Algorithm 2.1) and `IterationScheduler` the node agent uses, event by event:
jobs arrive online, are admitted into lanes or queue, and run iteration by iteration. Lanes run in
parallel (Salus §2.3.3); concurrent iterations share the GPU's compute, so when the running jobs' exclusive
utilisations add up to more than 1 each slows by that sum (a processor-sharing model of contention).

Lane layout per policy, as in the evaluation: PACK packs jobs into many lanes with Algorithm 2.1
(§2.4.1); FIFO (no sharing), SRTF and FAIR time-share a single lane (§2.5.1), admitting a job
while ΣP + max E ≤ C holds with everyone's persistent memory resident (Tessera's reading of SRTF's
"its own safety condition").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.policy.lanes.iteration import IterationScheduler, Policy, make_iteration_scheduler
from tessera.policy.lanes.model import GpuLanes, LaneJob, LaneModelError

_EPS = 1e-9


@dataclass(frozen=True)
class TrainingJob:
    """A training job: `duration` and `iteration` are exclusive-GPU seconds; `utilization` ∈ (0, 1]."""

    job_id: str
    arrival: float
    duration: float
    iteration: float
    persistent: float
    ephemeral: float
    utilization: float = 1.0

    def __post_init__(self) -> None:
        if self.duration <= 0 or self.iteration <= 0:
            raise LaneModelError(f"job {self.job_id!r}: duration and iteration must be positive")
        if not 0 < self.utilization <= 1:
            raise LaneModelError(
                f"job {self.job_id!r}: utilization must be in (0, 1], got {self.utilization}"
            )


@dataclass
class ReplayResult:
    policy: Policy
    completion: dict[str, float] = field(default_factory=dict)
    first_start: dict[str, float] = field(default_factory=dict)
    arrival: dict[str, float] = field(default_factory=dict)
    max_lanes: int = 0

    @property
    def makespan(self) -> float:
        return max(self.completion.values()) - min(self.arrival.values())

    def jct(self) -> list[float]:
        return [self.completion[j] - self.arrival[j] for j in self.completion]

    def queuing(self) -> list[float]:
        return [self.first_start[j] - self.arrival[j] for j in self.completion]

    @property
    def avg_jct(self) -> float:
        return sum(self.jct()) / len(self.completion)

    @property
    def avg_queuing(self) -> float:
        return sum(self.queuing()) / len(self.completion)

    def p95_jct(self) -> float:
        values = sorted(self.jct())
        return values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]


class _SingleLane:
    """Admission for the single time-shared lane: ΣP + max E ≤ C."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.jobs: dict[str, LaneJob] = {}

    def admit(self, job: LaneJob) -> str | None:
        p = sum(j.persistent for j in self.jobs.values()) + job.persistent
        e = max([j.ephemeral for j in self.jobs.values()] + [job.ephemeral])
        if p + e > self.capacity + _EPS:
            return None
        self.jobs[job.job_id] = job
        return "lane-1"

    def depart(self, job_id: str) -> None:
        del self.jobs[job_id]


def replay(jobs: list[TrainingJob], policy: Policy, capacity: float) -> ReplayResult:
    """Run `jobs` to completion on one GPU of `capacity` under `policy`; returns per-job times."""
    if not jobs:
        raise LaneModelError("replay needs at least one job")
    for tj in jobs:
        if tj.persistent + tj.ephemeral > capacity:
            raise LaneModelError(
                f"job {tj.job_id!r} needs {tj.persistent + tj.ephemeral} > GPU capacity {capacity}"
            )
    r = _Replay(jobs, policy, capacity)
    r.run()
    return r.result


class _Replay:
    """One replay's state; `run` loops: admit arrivals, start an iteration in each idle lane, advance time
    to the next iteration end or arrival, then finish the iterations that ended."""

    def __init__(self, jobs: list[TrainingJob], policy: Policy, capacity: float) -> None:
        self.policy = policy
        self.pending = sorted(jobs, key=lambda j: j.arrival)
        self.by_id = {j.job_id: j for j in jobs}
        self.result = ReplayResult(policy, arrival={j.job_id: j.arrival for j in jobs})
        self.packer = GpuLanes(capacity) if policy == "PACK" else None
        self.single = None if self.packer is not None else _SingleLane(capacity)
        self.sched: dict[str, IterationScheduler] = {}  # one iteration scheduler per lane
        self.remaining = {j.job_id: j.duration for j in jobs}
        self.running: dict[
            str, tuple[str, float]
        ] = {}  # lane -> (job, exclusive work left in this iteration)
        self.queue: list[LaneJob] = []
        self.lane_of: dict[str, str] = {}
        self.t = self.pending[0].arrival
        self.i = 0  # next of `pending` to arrive

    def run(self) -> None:
        while self.i < len(self.pending) or self.lane_of:
            self._arrivals()
            self._grant()
            self.result.max_lanes = max(self.result.max_lanes, len(self.sched))
            if not self.running:
                if self.i >= len(self.pending):
                    raise LaneModelError(
                        f"replay stalled at t={self.t}: {len(self.queue)} queued jobs can never be admitted"
                    )
                self.t = self.pending[self.i].arrival
                continue
            for lane in self._advance():
                self._iteration_done(lane)

    def _arrivals(self) -> None:
        pending = self.pending
        while self.i < len(pending) and pending[self.i].arrival <= self.t + _EPS:
            j = pending[self.i]
            lj = LaneJob(j.job_id, j.persistent, j.ephemeral)
            if self.queue or not self._place(lj):
                self.queue.append(lj)  # FIFO admission: nobody overtakes a queued session
            self.i += 1

    def _place(self, lj: LaneJob) -> bool:
        if self.packer is not None:
            admission = self.packer.admit(lj)
            lane = None if admission is None else admission.lane_id
        else:
            assert self.single is not None
            lane = self.single.admit(lj)
        if lane is None:
            return False
        if lane not in self.sched:
            self.sched[lane] = make_iteration_scheduler(self.policy)
        self.sched[lane].add_job(lj.job_id, self.t, remaining_seconds=self.remaining[lj.job_id])
        self.sched[lane].request(lj.job_id, self.t)
        self.lane_of[lj.job_id] = lane
        return True

    def _grant(self) -> None:
        """Each idle lane starts its scheduler's next iteration."""
        for lane, s in self.sched.items():
            if lane not in self.running:
                granted = s.grant(self.t)
                if granted is not None:
                    self.result.first_start.setdefault(granted, self.t)
                    self.running[lane] = (
                        granted,
                        min(self.by_id[granted].iteration, self.remaining[granted]),
                    )

    def _advance(self) -> list[str]:
        """Move time to the first iteration end or arrival, the running iterations sharing the GPU's
        compute; returns the lanes whose iteration ended."""
        load = sum(self.by_id[job].utilization for job, _ in self.running.values())
        rate = 1.0 / max(1.0, load)
        dt = min(work / rate for _, work in self.running.values())
        if self.i < len(self.pending):
            dt = min(dt, self.pending[self.i].arrival - self.t)
        self.t += dt
        done_lanes = []
        for lane, (job, work) in self.running.items():
            left = work - dt * rate
            self.remaining[job] -= dt * rate
            if left <= _EPS:
                done_lanes.append(lane)
            else:
                self.running[lane] = (job, left)
        return done_lanes

    def _iteration_done(self, lane: str) -> None:
        job, _ = self.running.pop(lane)
        s = self.sched[lane]
        if self.remaining[job] > _EPS:
            s.finish(job, self.t, remaining_seconds=self.remaining[job])
            s.request(job, self.t)
            return
        s.finish(job, self.t, remaining_seconds=0.0)
        s.remove_job(job, self.t)
        self.result.completion[job] = self.t
        del self.lane_of[job]
        if self.packer is not None:
            self.packer.depart(job)
            # Lanes Algorithm 2.1 deleted lose their scheduler.
            for gone in [lid for lid in self.sched if lid not in self.packer.lanes]:
                del self.sched[gone]
        else:
            assert self.single is not None
            self.single.depart(job)
        while self.queue and self._place(self.queue[0]):
            self.queue.pop(0)
