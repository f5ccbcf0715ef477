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
    pending = sorted(jobs, key=lambda j: j.arrival)
    by_id = {j.job_id: j for j in jobs}
    result = ReplayResult(policy, arrival={j.job_id: j.arrival for j in jobs})
    packer = GpuLanes(capacity) if policy == "PACK" else None
    single = None if packer is not None else _SingleLane(capacity)
    sched: dict[str, IterationScheduler] = {}  # one iteration scheduler per lane
    remaining = {j.job_id: j.duration for j in jobs}
    running: dict[str, tuple[str, float]] = {}  # lane -> (job, exclusive work left in this iteration)
    queue: list[LaneJob] = []
    lane_of: dict[str, str] = {}
    t = pending[0].arrival
    i = 0

    def place(lj: LaneJob) -> bool:
        if packer is not None:
            admission = packer.admit(lj)
            lane = None if admission is None else admission.lane_id
        else:
            assert single is not None
            lane = single.admit(lj)
        if lane is None:
            return False
        if lane not in sched:
            sched[lane] = make_iteration_scheduler(policy)
        sched[lane].add_job(lj.job_id, t, remaining_seconds=remaining[lj.job_id])
        sched[lane].request(lj.job_id, t)
        lane_of[lj.job_id] = lane
        return True

    while i < len(pending) or lane_of:
        while i < len(pending) and pending[i].arrival <= t + _EPS:
            j = pending[i]
            lj = LaneJob(j.job_id, j.persistent, j.ephemeral)
            if queue or not place(lj):
                queue.append(lj)  # FIFO admission: nobody overtakes a queued session
            i += 1
        for lane, s in sched.items():
            if lane not in running:
                granted = s.grant(t)
                if granted is not None:
                    result.first_start.setdefault(granted, t)
                    running[lane] = (granted, min(by_id[granted].iteration, remaining[granted]))
        result.max_lanes = max(result.max_lanes, len(sched))
        if not running:
            if i >= len(pending):
                raise LaneModelError(
                    f"replay stalled at t={t}: {len(queue)} queued jobs can never be admitted"
                )
            t = pending[i].arrival
            continue
        load = sum(by_id[job].utilization for job, _ in running.values())
        rate = 1.0 / max(1.0, load)
        dt = min(work / rate for _, work in running.values())
        if i < len(pending):
            dt = min(dt, pending[i].arrival - t)
        t += dt
        done_lanes = []
        for lane, (job, work) in running.items():
            left = work - dt * rate
            remaining[job] -= dt * rate
            if left <= _EPS:
                done_lanes.append(lane)
            else:
                running[lane] = (job, left)
        for lane in done_lanes:
            job, _ = running.pop(lane)
            s = sched[lane]
            if remaining[job] <= _EPS:
                s.finish(job, t, remaining_seconds=0.0)
                s.remove_job(job, t)
                result.completion[job] = t
                del lane_of[job]
                if packer is not None:
                    packer.depart(job)
                    # Lanes Algorithm 2.1 deleted lose their scheduler.
                    for gone in [lid for lid in sched if lid not in packer.lanes]:
                        del sched[gone]
                else:
                    assert single is not None
                    single.depart(job)
                while queue and place(queue[0]):
                    queue.pop(0)
            else:
                s.finish(job, t, remaining_seconds=remaining[job])
                s.request(job, t)
    return result
