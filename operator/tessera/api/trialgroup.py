"""`TrialGroup`: hyper-parameter trials whose makespan Fluid minimises (Fluid, Yu's dissertation ch. 3).

A tuning algorithm emits TrialGroups (§2.4): all trials of a grid/random search, or one round of an
iterative tuner. Fluid gives each trial a width w_i — 1/p of a GPU when p trials are packed with MPS, or
w GPUs of distributed training — by water-filling (Alg. 3.1, 3.2).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tessera.api.base import (
    DNS_LABEL,
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

MAX_TRIALS = 512

TuningAlgorithmName = Literal[
    "grid", "random", "hyperband", "successiveHalving", "asha", "bohb", "syncBohb", "pbt"
]


class TuningAlgorithmInfo(WireModel):
    """The tuner that emitted this group (Table 3.1); informational for Fluid, used by reports."""

    name: TuningAlgorithmName
    round: int = Field(default=0, ge=0, description="Index of this group in the tuner's sequence of rounds.")
    params: dict[str, Any] = Field(default_factory=dict, description="Tuner parameters, passed through.")


class TrialSpec(WireModel):
    """One trial: a configuration and its training budget (§2.4, §3.2)."""

    name: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL, description="Trial name, unique in the group."
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Hyper-parameters, handed to the trial's pods."
    )
    budget_iterations: int = Field(
        ge=1, le=MAX_ITERATIONS, description="Training budget of the trial in iterations."
    )
    iter_time_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds per iteration on one GPU, if known; profiled otherwise.",
    )


class FluidSettings(WireModel):
    """Fluid's tunables (§2.9, §3.2). The dissertation gives no values for O_th and ε: the defaults are ours."""

    max_pack_per_gpu: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TRIALS,
        description="c: most trials packed on one GPU; unset derives it from O_th (Eq. 3.1).",
    )
    packing_benefit_threshold: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="O_th: pack a p-th trial only while its marginal benefit O_p exceeds this (default: Fluid gives none).",
    )
    max_workers_per_trial: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS,
        description="d: most GPUs per trial (w <= d); unset means the group's GPUs.",
    )
    scaling_overhead_seconds: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        description="ε: reconfiguration cost DynamicFluid weighs (Alg. 3.2; default: Fluid gives none).",
    )
    profile_iterations: int = Field(
        default=5, ge=1, le=MAX_ITERATIONS, description="Iterations profiled per trial (§2.12)."
    )
    profile_fraction: float = Field(
        default=0.1, gt=0, le=1, description="Share of the group's GPUs used for profiling (§2.12)."
    )
    enable_intra_gpu: bool = Field(default=True, description="Allow packing trials on one GPU (MPS).")
    enable_inter_gpu: bool = Field(default=True, description="Allow distributed trials across GPUs.")
    enable_dynamic: bool = Field(default=True, description="Re-plan with DynamicFluid as resources free up.")


class Target(WireModel):
    """Quality target for 'makespan to target' reports (Fluid, dissertation §3.6.1)."""

    metric: str = Field(min_length=1, description="Metric name the trials report, e.g. accuracy.")
    threshold: float
    goal: Literal["maximize", "minimize"] = "maximize"


class TrialGroupSpec(WireModel):
    """What Fluid needs to plan a group (Fluid, dissertation §3.4.1)."""

    template: PodTemplateSpec = Field(description="Pod template of the trial pods.")
    trials: list[TrialSpec] = Field(min_length=1, max_length=MAX_TRIALS)
    gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS,
        description="n: GPUs available to the group; unset takes what the cluster grants.",
    )
    algorithm: TuningAlgorithmInfo | None = None
    fluid: FluidSettings = Field(default_factory=FluidSettings)
    target: Target | None = None
    gpu: GPUUsage = Field(default_factory=GPUUsage)

    cross_field_rules = (
        unique_by("trials", "name", "trial names must be unique"),
        CrossFieldRule(
            cel="!has(self.fluid) || !has(self.fluid.maxPackPerGPU) || !has(self.gpu) || !has(self.gpu.lane) "
            "|| self.fluid.maxPackPerGPU * self.gpu.lane.memoryMiB <= self.gpu.gpuMemoryMiB - self.gpu.reservedMiB",
            message="fluid.maxPackPerGPU lanes of gpu.lane.memoryMiB must fit in gpu.gpuMemoryMiB - gpu.reservedMiB",
            check=lambda s: (
                s.fluid.max_pack_per_gpu is None
                or s.gpu.lane is None
                or s.fluid.max_pack_per_gpu * s.gpu.lane.memory_mib
                <= s.gpu.gpu_memory_mib - s.gpu.reserved_mib
            ),
            field_path=".fluid.maxPackPerGPU",
        ),
    )


class TrialPlacement(WireModel):
    """Where a trial runs: w < 1 → one GPU and a pack slot; w ≥ 1 → w GPUs."""

    node: str | None = None
    gpu_indices: list[int] = Field(default_factory=list)
    pack_slot: int | None = Field(default=None, ge=0)


class TrialStatus(WireModel):
    """Per-trial plan and measurements (§3.2 'Measured or derived', 'Outputs')."""

    name: str
    phase: Literal["Pending", "Profiling", "Running", "Queued", "Scaling", "Completed", "Stopped"] = "Pending"
    width: float | None = Field(default=None, gt=0, description="w_i: 1/c, or an integer number of GPUs.")
    placement: TrialPlacement | None = None
    iterations_done: int = Field(default=0, ge=0)
    h1_seconds: float | None = Field(
        default=None, ge=0, description="Remaining runtime on one GPU (h_{i,1})."
    )
    alpha: float | None = Field(default=None, ge=1, description="Packing overhead α_i (Eq. 3.2).")
    beta: float | None = Field(default=None, ge=1, description="Scaling overhead β_i (Eq. 3.2).")
    result: float | None = Field(
        default=None,
        description="Latest metric value the trial reported (the `loss` of tessera.io/progress, tessera.sdk).",
    )


class Reallocation(WireModel):
    """The last DynamicFluid decision and the rule that fired (Alg. 3.2)."""

    time: Timestamp
    rule: str
    reason: str | None = None


class TrialGroupStatus(WireModel):
    """What the operator reports for a TrialGroup (§3.2 outputs)."""

    phase: Literal["Pending", "Profiling", "Running", "Succeeded", "Failed"] = "Pending"
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this status reflects."
    )
    trials_running: int = Field(default=0, ge=0)
    trials_done: int = Field(default=0, ge=0)
    gpus: int = Field(default=0, ge=0, description="GPUs the group holds now.")
    estimated_makespan_seconds: float | None = Field(default=None, ge=0, description="max_i h_{i,w_i}.")
    measured_pack_limit: int | None = Field(default=None, ge=1, description="Measured c.")
    measured_worker_limit: int | None = Field(default=None, ge=1, description="Measured d.")
    packing_benefit: list[float] = Field(default_factory=list, description="O_p for p = 2, 3, ... (Eq. 3.1).")
    trials: list[TrialStatus] = Field(default_factory=list)
    last_reallocation: Reallocation | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Valid (False for a refused spec), GPUsAvailable (False while the group waits for its GPU pool), "
            "Planned (False when Fluid could not plan), "
            "QueueResolved (only in a namespace with the tessera.io/queue label: True, QueueFound, when the label "
            "names a Queue that exists; False, QueueNotFound, when it names none, and the object is in the "
            "default queue until that Queue is created or the label is changed), "
            "and Ready: True when the group holds its GPU pool, Fluid "
            "planned its trials and the pods of every planned (not queued) trial are created (reason Running), or"
            " once every trial ended (Succeeded); False while its spec is refused (InvalidSpec), it waits for its"
            " pool (WaitingForGPUs), it has no plan (NotPlanned) or pods of planned trials could not be created "
            "(PodsNotCreated)."
        ),
    )
