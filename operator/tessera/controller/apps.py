"""An App as the ARBITER sees it: leases, per-job progress, and the pods its leases call for.

State lives in the App's status (leases with node, GPU indices, job and expiry; per-job iterations left;
start time; GPU-seconds held), so a restarted operator rebuilds every `AppRecord` from the objects and
neither loses a lease nor creates a second set of pods. Themis §4.2.2 (AGENT state, leases).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from tessera.api import contract
from tessera.api.app import AppSpec, AppStatus, JobSpec, JobStatus, Lease
from tessera.api.base import wire_name
from tessera.api.resources import ManifestError, parse_app
from tessera.cluster import Cluster, Sensitivity
from tessera.controller.estimator import JobWork, estimator_for
from tessera.controller.pods import PodPlan, gang_plans
from tessera.controller.view import PodInfo, gpu_id, group_by_node, split_gpu_id
from tessera.policy.themis.estimate import HalvingPlan, NAvg
from tessera.policy.training import AppState


def to_time(ts: datetime | str | None) -> float | None:
    if ts is None:
        return None
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.timestamp()


def to_stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


@dataclass(slots=True)
class LeaseRec:
    """GPUs of one job on one node, held until `expires` (epoch seconds)."""

    gpus: tuple[str, ...]
    job: str
    expires: float
    source: str

    def to_api(self) -> Lease:
        node, _ = split_gpu_id(self.gpus[0])
        return Lease(
            node=node,
            gpu_indices=[split_gpu_id(g)[1] for g in self.gpus],
            job=self.job,
            expires_at=to_stamp(self.expires),
            source="leftover" if self.source == "leftover" else "auction",
        )


@dataclass(slots=True)
class AppRecord:
    namespace: str
    name: str
    uid: str
    spec: AppSpec
    body: Mapping[str, Any]
    start: float
    leases: list[LeaseRec] = field(default_factory=list)
    done_iters: dict[str, int] = field(default_factory=dict)
    active_gpu_seconds: float = 0.0
    accounted_until: float = 0.0
    navg: NAvg | None = None
    rho: float | None = None
    t_shared: float | None = None  # ρ's numerator (elapsed + remaining), seconds; inf while holding nothing
    t_independent: float | None = None  # ρ's denominator T_id, seconds
    finished_at: float | None = None
    # GPU → job of the leases that ended in this round: the policy may hand them back (renewal in place),
    # and a job gets back the GPUs it ran on, so its pods stay where they are.
    previous: dict[str, str] = field(default_factory=dict)
    # When the current holding began (status holdingSince): set by the round that first leaves the App
    # holding GPUs after it held none, cleared by one that leaves it none. A round that expires a lease
    # and renews it keeps it: the App never stopped. A queue's minimum runtime counts from here.
    held_since: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    # --- jobs -------------------------------------------------------------------------------------

    def target_iters(self, job: JobSpec) -> int:
        """Where a job stops: its iterTotal, or the tuner's forecast under performance-curve stopping."""
        if self.spec.tuning.mode == "performanceCurve" and job.predicted_stop_iteration is not None:
            return job.predicted_stop_iteration
        return job.iter_total

    def iters_left(self, job: JobSpec) -> int:
        return max(0, self.target_iters(job) - self.done_iters.get(job.name, 0))

    def live_jobs(self) -> list[JobSpec]:
        return [j for j in self.spec.jobs if self.iters_left(j) > 0]

    @property
    def done(self) -> bool:
        return not self.live_jobs()

    def demand(self) -> int:
        d = sum(j.max_gpus for j in self.live_jobs())
        return min(d, self.spec.max_gpus) if self.spec.max_gpus is not None else d

    def held(self) -> set[str]:
        return {g for lease in self.leases for g in lease.gpus}

    def lease_pairs(self) -> set[tuple[str, str]]:
        """(job, GPU) under lease: a grant of exactly these is a renewal."""
        return {(lease.job, g) for lease in self.leases for g in lease.gpus}

    def job_gpus(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for lease in self.leases:
            out.setdefault(lease.job, []).extend(lease.gpus)
        return out

    def sensitivity(self) -> Sensitivity:
        """The App's placement sensitivity: the most sensitive job's (one gang spans the App's GPUs)."""
        worst = max(
            self.spec.jobs,
            key=lambda j: (j.placement_sensitivity.cross_rack, j.placement_sensitivity.cross_machine),
        ).placement_sensitivity
        return Sensitivity(worst.slot, worst.machine, worst.cross_machine, worst.cross_rack)

    def halving_plan(self) -> HalvingPlan | None:
        """The Eq. 2 plan when the spec carries successive-halving settings with per-phase iterations;
        without itersPerPhase the jobs are estimated as independent (the last job sets the time)."""
        sh = self.spec.tuning.successive_halving
        if self.spec.tuning.mode != "successiveHalving" or sh is None or not sh.iters_per_phase:
            return None
        return HalvingPlan(
            num_configs=sh.num_configs,
            iters_per_phase=tuple(float(i) for i in sh.iters_per_phase),
            job_demand_max=max(j.max_gpus for j in self.spec.jobs),
            eta=sh.eta,
        )

    def work(self) -> tuple[float, float]:
        total = sum(self.target_iters(j) * j.iter_time_serial_seconds for j in self.spec.jobs)
        left = sum(self.iters_left(j) * j.iter_time_serial_seconds for j in self.spec.jobs)
        return total, left

    def state(self, now: float, known: Collection[str] | None = None) -> AppState:
        """The AppState a TrainingPolicy expects (tessera.policy.training), from spec + progress; with
        `known`, the App holds only those of its leased GPUs (the ones in the policy's cluster)."""
        total, left = self.work()
        jobs = [
            JobWork(
                j.name,
                self.iters_left(j),
                j.iter_time_serial_seconds,
                j.max_gpus,
                float(self.done_iters.get(j.name, 0)),
            )
            for j in self.spec.jobs
        ]
        n_avg = self.navg.value(now) if self.navg is not None else 1.0
        return AppState(
            app_id=f"{self.namespace}/{self.name}",
            arrival=self.start,
            demand_max=self.demand(),
            held=frozenset(g for g in self.held() if known is None or g in known),
            sensitivity=self.sensitivity(),
            total_work=total,
            remaining_work=left,
            attained_service=self.active_gpu_seconds,
            n_avg=max(1.0, n_avg),
            estimator=estimator_for(jobs, self.halving_plan()),
            previous=frozenset(g for g in self.previous if known is None or g in known),
        )

    def note_holding(self, now: float) -> None:
        """After a round (or a reclaim): start or end the current holding."""
        if not self.leases:
            self.held_since = None
        elif self.held_since is None:
            self.held_since = now

    # --- progress ---------------------------------------------------------------------------------

    def account(self, now: float) -> None:
        """∫ GPUs held dt since the last call (status activeGpuSeconds)."""
        if now > self.accounted_until:
            self.active_gpu_seconds += len(self.held()) * (now - self.accounted_until)
            self.accounted_until = now

    def observe(self, pods: Sequence[PodInfo]) -> list[str]:
        """Fold the pods' reports into per-job progress; return jobs that completed just now.

        A job is done when a pod reports iterations at its target, or when all its pods exited
        successfully (the workload decides when it has converged)."""
        by_job: dict[str, list[PodInfo]] = {}
        for p in pods:
            job = p.labels.get(contract.LABEL_JOB)
            if job:
                by_job.setdefault(job, []).append(p)
        finished: list[str] = []
        for j in self.spec.jobs:
            before = self.iters_left(j)
            if before == 0:
                continue
            mine = by_job.get(j.name, [])
            reported = [p.progress_iterations for p in mine if p.progress_iterations is not None]
            if reported:
                self.done_iters[j.name] = max(
                    self.done_iters.get(j.name, 0), min(max(reported), j.iter_total)
                )
            live = [p for p in mine if not p.deleting]
            if live and all(p.phase == "Succeeded" for p in live):
                self.done_iters[j.name] = self.target_iters(j)
            if self.iters_left(j) == 0:
                finished.append(j.name)
        return finished

    def release_finished(self) -> list[LeaseRec]:
        """Give back the leases of jobs that are done: Themis apps return GPUs they cannot use."""
        live = {j.name for j in self.live_jobs()}
        gone = [lease for lease in self.leases if lease.job not in live]
        self.leases = [lease for lease in self.leases if lease.job in live]
        return gone

    def revoke(self, gpus: Iterable[str]) -> int:
        """Take these GPUs out of the App's leases now (a team queue reclaims them); returns how many went.
        The pods on them are then deleted with the preemption grace, which is the checkpoint grace."""
        gone = set(gpus)
        kept: list[LeaseRec] = []
        n = 0
        for lease in self.leases:
            left = tuple(g for g in lease.gpus if g not in gone)
            n += len(lease.gpus) - len(left)
            if left:
                kept.append(dataclasses.replace(lease, gpus=left))
        self.leases = kept
        return n

    def expire(self, now: float) -> list[LeaseRec]:
        gone = [lease for lease in self.leases if lease.expires <= now]
        self.leases = [lease for lease in self.leases if lease.expires > now]
        self.previous.update((g, lease.job) for lease in gone for g in lease.gpus)
        return gone

    def grant(self, gpus: Sequence[str], expires: float, source: str, cluster: Cluster) -> list[LeaseRec]:
        """Hand new GPUs to the App's jobs (the App's own scheduler, Themis' two-level split §1.7):
        each job first gets back the GPUs it ran on until its lease ended this round (its pods stay), then
        jobs that already run first, then in spec order, each up to its maxGPUs; one lease per job and node.
        GPUs no job can use are not leased (the policy never grants beyond demand, so that is rare)."""
        have = self.job_gpus()
        live = self.live_jobs()
        pool = cluster.sorted(gpus)
        new: dict[str, list[str]] = {}
        if self.previous:
            room = {j.name: j.max_gpus - len(have.get(j.name, [])) for j in live}
            for g in list(pool):
                job = self.previous.get(g)
                if job is not None and room.get(job, 0) > 0:
                    new.setdefault(job, []).append(g)
                    room[job] -= 1
                    pool.remove(g)
            for job, gs in new.items():
                have[job] = [*have.get(job, []), *gs]
        order = sorted(range(len(live)), key=lambda i: (not have.get(live[i].name), i))
        for i in order:
            j = live[i]
            want = j.max_gpus - len(have.get(j.name, []))
            if want > 0 and pool:
                # Prefer GPUs on the nodes the job already uses (locality, Eq. 1's slowdown S).
                nodes = {split_gpu_id(g)[0] for g in have.get(j.name, [])}
                pool.sort(key=lambda g: (split_gpu_id(g)[0] not in nodes, cluster.order(g)))
                new[j.name], pool = [*new.get(j.name, []), *pool[:want]], pool[want:]
        out: list[LeaseRec] = []
        for job, gs in new.items():
            for node, idx in group_by_node(gs).items():
                out.append(LeaseRec(tuple(gpu_id(node, i) for i in idx), job, expires, source))
        self.leases = merged(self.leases + out)
        return out

    # --- pods and status --------------------------------------------------------------------------

    def pod_plans(self) -> list[PodPlan]:
        """One pod per job and node of its leases; ranks in node order; the job's pods form its gang."""
        return [
            plan
            for job, gs in sorted(self.job_gpus().items())
            for plan in gang_plans(
                gs,
                base=f"{self.name}-{job}",
                labels={contract.LABEL_APP: self.name, contract.LABEL_JOB: job},
                env={contract.ENV_JOB: job},
                workload=contract.WORKLOAD_TRAINING,
            )
        ]

    def status(self, now: float, phase: str | None = None) -> AppStatus:
        have = self.job_gpus()
        jobs = []
        for j in self.spec.jobs:
            left = self.iters_left(j)
            state: Literal["completed", "active", "pending"] = (
                "completed" if left == 0 else ("active" if have.get(j.name) else "pending")
            )
            jobs.append(
                JobStatus(
                    name=j.name,
                    state=state,
                    iters_remaining=left,
                    avg_time_per_iter_seconds=j.iter_time_serial_seconds,
                    gpus=len(have.get(j.name, [])),
                )
            )
        if phase is None:
            phase = "Succeeded" if self.done else ("Running" if self.leases else "Pending")
        rho = self.rho if self.rho is None or math.isfinite(self.rho) else None
        return AppStatus(
            phase=phase,  # type: ignore[arg-type]
            gpus=len(self.held()),
            rho=rho,
            start_time=to_stamp(self.start),
            holding_since=to_stamp(self.held_since) if self.held_since is not None and self.leases else None,
            finish_time=to_stamp(self.finished_at) if self.finished_at else None,
            active_gpu_seconds=self.active_gpu_seconds,
            elapsed_seconds=max(0.0, now - self.start),
            updated_at=to_stamp(now),
            jobs=jobs,
            leases=[lease.to_api() for lease in self.leases],
        )


def merged(leases: Iterable[LeaseRec]) -> list[LeaseRec]:
    """One lease per job, node and expiry, in (job, node) order; "auction" if any part came from it.
    A round may grant an App its GPUs in two grants (auction, then leftover) and the next round the same
    GPUs split the other way: without this the status and the ledger's keys would differ for a renewal."""
    groups: dict[tuple[str, str, float], list[LeaseRec]] = {}
    for lease in leases:
        groups.setdefault((lease.job, split_gpu_id(lease.gpus[0])[0], lease.expires), []).append(lease)
    out = []
    for (job, _, expires), parts in sorted(groups.items(), key=lambda kv: kv[0]):
        gpus = sorted({g for p in parts for g in p.gpus}, key=lambda g: split_gpu_id(g)[1])
        source = "auction" if any(p.source != "leftover" for p in parts) else "leftover"
        out.append(LeaseRec(tuple(gpus), job, expires, source))
    return out


def manifest_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a stored object that a manifest has (status and server fields dropped)."""
    meta = body.get("metadata") or {}
    out = {k: body[k] for k in ("apiVersion", "kind", "spec") if k in body}
    out["metadata"] = {"name": meta.get("name"), "namespace": meta.get("namespace")}
    return out


LABEL_VALUE_MAX = 63
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check_name(body: Mapping[str, Any], label: str, services: Sequence[str] = ()) -> None:
    """Raise ManifestError when the object's name cannot become what the operator derives from it: the
    value of `label` on its pods (at most 63 characters; the API server refuses the pods otherwise) and,
    for each suffix in `services`, the name of a Service (a DNS-1035 label of at most 63 characters)."""
    meta = body.get("metadata") or {}
    name, kind = str(meta.get("name", "")), str(body.get("kind", ""))
    limit = LABEL_VALUE_MAX - max((len(s) for s in services), default=0)
    if services and not (DNS_1035.match(name) and len(name) <= limit):
        where = " and ".join(f"the Service {name}{s}" for s in services)
        msg = (
            f"must be at most {limit} characters of lower-case letters, digits and '-', starting with a letter "
            f"and ending with a letter or digit: it names {where}"
        )
        raise ManifestError(kind, name, [("metadata.name", msg)])
    if len(name) > limit:
        msg = f"must be at most {limit} characters: it is the value of the {label} label on the pods"
        raise ManifestError(kind, name, [("metadata.name", msg)])


def record_from_body(body: Mapping[str, Any], now: float) -> AppRecord:
    """Parse an App (raises ManifestError) and recover leases and progress from its status."""
    check_name(body, contract.LABEL_APP)
    app = parse_app(manifest_of(body))
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    start = to_time(status.get("startTime")) or now
    rec = AppRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        spec=app.spec,
        body=body,
        start=start,
        accounted_until=now,
        active_gpu_seconds=float(status.get(wire_name("active_gpu_seconds")) or 0.0),
    )
    for js in status.get("jobs") or []:
        job = next((j for j in app.spec.jobs if j.name == js.get("name")), None)
        if job is not None and js.get("itersRemaining") is not None:
            rec.done_iters[job.name] = max(0, rec.target_iters(job) - int(js["itersRemaining"]))
    live = {j.name for j in app.spec.jobs}
    for lease in status.get("leases") or []:
        expires = to_time(lease.get("expiresAt"))
        job = lease.get("job")
        if expires is None or job not in live or not lease.get("gpuIndices"):
            continue
        gpus = tuple(gpu_id(str(lease["node"]), int(i)) for i in lease["gpuIndices"])
        rec.leases.append(LeaseRec(gpus, str(job), expires, str(lease.get("source", "auction"))))
    if rec.leases:  # the holding the status recorded goes on (without it: from now)
        rec.held_since = min(now, to_time(status.get(wire_name("holding_since"))) or now)
    return rec


def template_of(rec: AppRecord, job: str) -> Mapping[str, Any]:
    """The job's own template if it has one, else the App's (raw dicts, as written by the user)."""
    spec = rec.body.get("spec") or {}
    for j in spec.get("jobs") or []:
        if j.get("name") == job and j.get("template"):
            return dict(j["template"])
    return dict(spec.get("template") or {})
