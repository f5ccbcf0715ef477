"""Iteration scheduler for one GPU lane: which job runs its next iteration (Salus §2.4).

Jobs in a lane time-share it at iteration granularity; exactly one iteration runs at a time in a lane
(Salus §2.3.3), so `grant` returns None while one is running. The policies differ only in whom they pick:

- FIFO: order of arrival, non-preemptive in effect — the oldest job wins every boundary until it leaves
  (the evaluation's baseline runs jobs one at a time to completion, §2.5).
- PACK: inside one lane the same arrival order as FIFO; PACK's gain comes from opening many lanes
  (Algorithm 2.1), not from the order inside one (§2.4.1).
- SRTF: preemptive shortest-remaining-time-first at iteration boundaries; `priority` ranks first
  ("arbitrary criteria", §2.4.2), then remaining time, then arrival.
- FAIR: least service received so far (§2.4). Service is GPU-seconds by default, or memory×seconds
  (the measure in Salus' public code) with `service_measure="memory_seconds"`. A newcomer starts at the
  least service of the jobs present so it shares at once (Fig. 2.9: shares drop to 1/2, 1/3 on arrival)
  instead of monopolising the lane until it catches up; `newcomer_service="zero"` gives the literal reading.

Pure and stateful: time is always passed in, nothing reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Policy = Literal["FIFO", "PACK", "SRTF", "FAIR"]
POLICIES: tuple[Policy, ...] = ("FIFO", "PACK", "SRTF", "FAIR")
ServiceMeasure = Literal["gpu_seconds", "memory_seconds"]
NewcomerService = Literal["least", "zero"]


class IterationSchedulerError(ValueError):
    """A call that does not fit the lane's state (unknown job, double request, ...)."""


@dataclass
class _Job:
    job_id: str
    arrival: float
    seq: int  # tie-break for equal arrival times: order of add_job calls
    remaining_seconds: float | None
    memory_mib: int
    priority: int
    service: float = 0.0
    waiting_since: float | None = None


class IterationScheduler:
    """Base: bookkeeping shared by all policies; subclasses define `_key` (smaller runs first)."""

    policy: Policy = "FIFO"

    def __init__(self, *, service_measure: ServiceMeasure = "gpu_seconds") -> None:
        if service_measure not in ("gpu_seconds", "memory_seconds"):
            raise IterationSchedulerError(
                f"service_measure must be 'gpu_seconds' or 'memory_seconds', got {service_measure!r}"
            )
        self._service_measure = service_measure
        self._jobs: dict[str, _Job] = {}
        self._running: str | None = None
        self._running_since = 0.0
        self._seq = 0

    # -- membership -------------------------------------------------------------------------------
    def add_job(
        self,
        job_id: str,
        now: float,
        *,
        remaining_seconds: float | None = None,
        memory_mib: int = 0,
        priority: int = 0,
    ) -> None:
        if job_id in self._jobs:
            raise IterationSchedulerError(f"job {job_id!r} is already in this lane")
        if remaining_seconds is not None and remaining_seconds < 0:
            raise IterationSchedulerError(f"job {job_id!r}: remaining_seconds must be >= 0")
        if memory_mib < 0:
            raise IterationSchedulerError(f"job {job_id!r}: memory_mib must be >= 0")
        job = _Job(job_id, now, self._seq, remaining_seconds, memory_mib, priority)
        job.service = self._initial_service()
        self._seq += 1
        self._jobs[job_id] = job

    def remove_job(self, job_id: str, now: float) -> None:
        self._get(job_id)
        if self._running == job_id:
            self._account(job_id, now)
            self._running = None
        del self._jobs[job_id]

    # -- iteration boundaries ---------------------------------------------------------------------
    def request(self, job_id: str, now: float) -> None:
        """The job wants to run its next iteration."""
        job = self._get(job_id)
        if self._running == job_id:
            raise IterationSchedulerError(f"job {job_id!r} is running an iteration; call finish() first")
        if job.waiting_since is None:
            job.waiting_since = now

    def grant(self, now: float) -> str | None:
        """The waiting job that may start an iteration now, or None (one is running, or nobody waits)."""
        if self._running is not None:
            return None
        waiting = [j for j in self._jobs.values() if j.waiting_since is not None]
        if not waiting:
            return None
        chosen = min(waiting, key=self._key)
        chosen.waiting_since = None
        self._running = chosen.job_id
        self._running_since = now
        return chosen.job_id

    def finish(self, job_id: str, now: float, *, remaining_seconds: float | None = None) -> None:
        """The job's iteration ended; optionally report its new remaining time (SRTF)."""
        job = self._get(job_id)
        if self._running != job_id:
            raise IterationSchedulerError(f"job {job_id!r} is not running an iteration in this lane")
        self._account(job_id, now)
        self._running = None
        if remaining_seconds is not None:
            if remaining_seconds < 0:
                raise IterationSchedulerError(f"job {job_id!r}: remaining_seconds must be >= 0")
            job.remaining_seconds = remaining_seconds

    # -- views ------------------------------------------------------------------------------------
    def service(self) -> dict[str, float]:
        """Service received per job (GPU-seconds or MiB-seconds, see `service_measure`)."""
        return {j.job_id: j.service for j in self._jobs.values()}

    @property
    def running(self) -> str | None:
        return self._running

    def waiting(self) -> list[str]:
        return [j.job_id for j in self._jobs.values() if j.waiting_since is not None]

    def jobs(self) -> list[str]:
        return list(self._jobs)

    # -- internals --------------------------------------------------------------------------------
    def _get(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise IterationSchedulerError(f"job {job_id!r} is not in this lane; add_job() it first") from None

    def _account(self, job_id: str, now: float) -> None:
        job = self._jobs[job_id]
        elapsed = max(0.0, now - self._running_since)
        weight = float(job.memory_mib) if self._service_measure == "memory_seconds" else 1.0
        job.service += elapsed * weight

    def _initial_service(self) -> float:
        return 0.0

    def _key(self, job: _Job) -> tuple[float, ...]:
        return (job.arrival, float(job.seq))


class FifoScheduler(IterationScheduler):
    policy: Policy = "FIFO"


class PackScheduler(IterationScheduler):
    policy: Policy = "PACK"


class SrtfScheduler(IterationScheduler):
    policy: Policy = "SRTF"

    def _key(self, job: _Job) -> tuple[float, ...]:
        # Unknown remaining time ranks after every known one (the paper assumes durations are known).
        remaining = math.inf if job.remaining_seconds is None else job.remaining_seconds
        return (-float(job.priority), remaining, job.arrival, float(job.seq))


class FairScheduler(IterationScheduler):
    policy: Policy = "FAIR"

    def __init__(
        self,
        *,
        service_measure: ServiceMeasure = "gpu_seconds",
        newcomer_service: NewcomerService = "least",
    ) -> None:
        super().__init__(service_measure=service_measure)
        if newcomer_service not in ("least", "zero"):
            raise IterationSchedulerError(
                f"newcomer_service must be 'least' or 'zero', got {newcomer_service!r}"
            )
        self._newcomer = newcomer_service

    def _initial_service(self) -> float:
        if self._newcomer == "zero" or not self._jobs:
            return 0.0
        return min(j.service for j in self._jobs.values())

    def _key(self, job: _Job) -> tuple[float, ...]:
        return (job.service, job.arrival, float(job.seq))


def make_iteration_scheduler(
    policy: Policy,
    *,
    service_measure: ServiceMeasure = "gpu_seconds",
    newcomer_service: NewcomerService = "least",
) -> IterationScheduler:
    """The iteration scheduler for `policy` (one of FIFO, PACK, SRTF, FAIR)."""
    if policy == "FIFO":
        return FifoScheduler(service_measure=service_measure)
    if policy == "PACK":
        return PackScheduler(service_measure=service_measure)
    if policy == "SRTF":
        return SrtfScheduler(service_measure=service_measure)
    if policy == "FAIR":
        return FairScheduler(service_measure=service_measure, newcomer_service=newcomer_service)
    raise IterationSchedulerError(f"unknown lane policy {policy!r}; expected one of {', '.join(POLICIES)}")
