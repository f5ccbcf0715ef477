"""`App`: training work that should finish fairly under Themis (Themis, Mahajan et al., NSDI'20).

An App is one or more jobs (a single training job, or the jobs of a hyper-parameter search) that bid
together in Themis' finish-time-fair auctions. The spec carries what the AGENT needs to estimate
ρ = T_shared / T_id (§1.3-§1.5); the status carries what it maintains (§5.2) and what each round
decided (§5.4).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tessera.api.base import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    MAX_GPUS,
    MAX_ITERATIONS,
    MAX_SECONDS,
    Condition,
    CrossFieldRule,
    PodTemplateSpec,
    Timestamp,
    WireModel,
    unique_by,
)
from tessera.api.gpu import GPUUsage

MAX_JOBS = 256
MAX_PHASES = 32


class PlacementSensitivity(WireModel):
    """Slowdown S ≥ 1 of a job by how spread its GPUs are (§1.4, §3.2; crude defaults, footnote 3)."""

    slot: float = Field(default=1.0, ge=1.0, description="All GPUs in one slot (e.g. one PCIe switch).")
    machine: float = Field(default=1.0, ge=1.0, description="All GPUs on one machine.")
    cross_machine: float = Field(default=1.1, ge=1.0, description="GPUs on several machines of one rack.")
    cross_rack: float = Field(default=1.3, ge=1.0, description="GPUs across racks.")

    cross_field_rules = (
        CrossFieldRule(
            cel="self.slot <= self.machine && self.machine <= self.crossMachine "
            "&& self.crossMachine <= self.crossRack",
            message="must not decrease with spread: slot <= machine <= crossMachine <= crossRack",
            check=lambda s: s.slot <= s.machine <= s.cross_machine <= s.cross_rack,
        ),
    )


class JobSpec(WireModel):
    """One training job of an App (§1.1: iter_total, iter_time_serial, job_demand_max)."""

    name: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL, description="Job name, unique in the App."
    )
    iter_total: int = Field(
        ge=1, le=MAX_ITERATIONS, description="Iterations to run to completion (iter_total)."
    )
    iter_time_serial_seconds: float = Field(
        gt=0, le=MAX_SECONDS, description="Seconds per iteration on one GPU (iter_time_serial)."
    )
    max_gpus: int = Field(
        ge=1, le=MAX_GPUS, description="Most GPUs the job can use at once (job_demand_max)."
    )
    placement_sensitivity: PlacementSensitivity = Field(default_factory=PlacementSensitivity)
    checkpoint_seconds: float = Field(
        default=10.0,
        ge=0,
        le=MAX_SECONDS,
        description="Cost of giving up GPUs: checkpoint and restart (§5.1, L1520: 5-10 s).",
    )
    predicted_stop_iteration: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ITERATIONS,
        description="Pessimistic forecast of where a performance-curve tuner stops this job (§1.5b).",
    )
    template: PodTemplateSpec | None = Field(
        default=None, description="Pod template for this job; defaults to the App's template."
    )

    cross_field_rules = (
        CrossFieldRule(
            cel="!has(self.predictedStopIteration) || self.predictedStopIteration <= self.iterTotal",
            message="predictedStopIteration must be <= iterTotal",
            check=lambda s: s.predicted_stop_iteration is None or s.predicted_stop_iteration <= s.iter_total,
            field_path=".predictedStopIteration",
        ),
    )


class SuccessiveHalving(WireModel):
    """Successive-halving tuning (§1.5a, §6.2): n configs, halved by η each phase."""

    num_configs: int = Field(ge=1, le=MAX_JOBS, description="Jobs in the first phase (n).")
    budget_gpu_seconds: float = Field(
        gt=0, le=MAX_GPUS * MAX_SECONDS, description="Total GPU-seconds of the search (B)."
    )
    iters_per_phase: list[Annotated[int, Field(le=MAX_ITERATIONS)]] = Field(
        default_factory=list,
        max_length=MAX_PHASES,
        description="Iterations each surviving job runs per phase, e.g. [8, 16, 36]; empty derives them from B.",
    )
    eta: int = Field(default=2, ge=2, le=MAX_JOBS, description="Halving factor η (the paper uses 2).")

    cross_field_rules = (
        CrossFieldRule(
            cel="self.itersPerPhase.all(x, x >= 1)",
            message="itersPerPhase entries must be >= 1",
            check=lambda s: all(x >= 1 for x in s.iters_per_phase),
            field_path=".itersPerPhase",
        ),
    )


class Tuning(WireModel):
    """How a multi-job App's work shrinks over time, which sets its ideal finish time (§1.5)."""

    mode: Literal["none", "successiveHalving", "performanceCurve"] = Field(
        default="none", description="none: independent jobs; or the tuner whose schedule ρ must follow."
    )
    successive_halving: SuccessiveHalving | None = None

    cross_field_rules = (
        CrossFieldRule(
            cel="self.mode != 'successiveHalving' || has(self.successiveHalving)",
            message="mode successiveHalving needs the successiveHalving block",
            check=lambda s: s.mode != "successiveHalving" or s.successive_halving is not None,
            field_path=".successiveHalving",
        ),
    )


class AppSpec(WireModel):
    """What the Themis AGENT of an App needs (§5.1)."""

    template: PodTemplateSpec = Field(description="Pod template of the App's training pods.")
    jobs: list[JobSpec] = Field(min_length=1, max_length=MAX_JOBS, description="The App's jobs.")
    max_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS,
        description="app_demand_max; defaults to the sum of the jobs' maxGPUs.",
    )
    tuning: Tuning = Field(default_factory=Tuning)
    gpu: GPUUsage = Field(default_factory=GPUUsage)
    priority_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="A scheduling.k8s.io PriorityClass: its value is the App's priority inside its team queue "
        "(higher is served first; unset: 0). The App's pods do not get it (kube-scheduler would preempt pods "
        "whose GPUs the operator still leases); a template may name one for them.",
    )
    preemptible: bool = Field(
        default=True,
        description="false: once the App holds GPUs it keeps them until it is done (its leases are renewed); "
        "neither a queue's reclaim nor a higher priority takes them. They still count against its queue.",
    )

    cross_field_rules = (unique_by("jobs", "name", "job names must be unique"),)


class JobStatus(WireModel):
    """Progress of one job as the AGENT tracks it (§5.2)."""

    name: str
    state: Literal["pending", "active", "stopped", "completed"] = "pending"
    iters_remaining: int | None = Field(default=None, ge=0)
    avg_time_per_iter_seconds: float | None = Field(default=None, ge=0)
    gpus: int = Field(default=0, ge=0, description="GPUs the job holds now.")


class Lease(WireModel):
    """GPUs won in one round, held until `expiresAt` (§1.8, §5.4)."""

    node: str
    gpu_indices: list[int] = Field(default_factory=list)
    job: str | None = None
    expires_at: Timestamp = Field(
        description=(
            "When the lease ends unless renewed. A renewal on the same GPUs is recorded in the operator's "
            "renewal ledger first; this field follows within the status staleness bound (updatedAt says how "
            "fresh it is), so it may lie in the past for a lease that was renewed."
        )
    )
    source: Literal["auction", "leftover"] = Field(
        description="Whether the auction or leftover step granted it."
    )


class AppStatus(WireModel):
    """What the operator reports for an App (§5.2, §5.4)."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed"] = "Pending"
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this status reflects."
    )
    gpus: int = Field(default=0, ge=0, description="GPUs the App holds now.")
    rho: float | None = Field(default=None, ge=0, description="Current finish-time fairness ρ estimate.")
    rho_final: float | None = Field(default=None, ge=0, description="(T_finish - T_start) / T_id at the end.")
    start_time: Timestamp | None = None
    holding_since: Timestamp | None = Field(
        default=None,
        description="When the App's current holding of GPUs began (it last went from none to some; a lease "
        "renewed when it ends continues it): its queue's minRuntimeSeconds counts from here.",
    )
    finish_time: Timestamp | None = None
    active_gpu_seconds: float = Field(default=0.0, ge=0, description="∫ N_active dt, for N_avg.")
    elapsed_seconds: float = Field(default=0.0, ge=0)
    updated_at: Timestamp | None = Field(
        default=None,
        description=(
            "When the operator wrote this status. Lease expiries renewed since are in its renewal ledger and "
            "reach status within the status staleness bound (a lease period by default)."
        ),
    )
    tuning_phase: int = Field(default=0, ge=0)
    jobs: list[JobStatus] = Field(default_factory=list)
    leases: list[Lease] = Field(default_factory=list)
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Admitted (admission control let the App bid), Valid (False for a refused spec, naming every bad "
            "field), "
            "QueueResolved (only in a namespace with the tessera.io/queue label: True, QueueFound, when the label "
            "names a Queue that exists; False, QueueNotFound, when it names none, and the object is in the "
            "default queue until that Queue is created or the label is changed), "
            "and Ready: True when the App is admitted, holds leases and every pod its leases call for is "
            "created (reason Running), or once all its jobs completed (Succeeded); False while its spec is "
            "refused (InvalidSpec), it is not admitted (NotAdmitted), it bids without a lease (WaitingForGPUs) or"
            " pods its leases call for could not be created (PodsNotCreated; the GangFailed event says why)."
        ),
    )
