"""`ModelDeployment`: a model served under a latency SLO.

Inputs come from three readings: Orloj's distribution-aware batching for dynamic models
(Orloj, Yu et al.), Symphony's deferred batching and load-proportional GPUs for static models
(Symphony, Chen et al.) and AlpaServe's placement inputs (Li et al., OSDI'23, §4-5).
Defaults are the papers' where they give one; "open in the papers" marks Tessera's choice of value.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import Field

from tessera.api.base import Condition, CrossFieldRule, PodTemplateSpec, WireModel, unique_by
from tessera.api.gpu import GPUUsage

MAX_BATCH_SIZES = 64
MAX_APPLICATIONS = 64
MAX_BINS = 4096


def _strictly_increasing(values: list[int] | list[float]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def _non_decreasing(values: list[float]) -> bool:
    return all(a <= b for a, b in itertools.pairwise(values))


# CEL has no index loop; Kubernetes' list library gives isSorted() and indexOf().


def _cel_strictly_increasing(items: str, key: str | None = None) -> str:
    """CEL: the list `items` (by its elements' field `key`, if given) is strictly increasing.

    Keyed lists are compared pairwise by position (`indexOf`) rather than through `map(...).isSorted()`:
    the API server cannot bound the size of a `map` result when it estimates a rule's cost, and rejects
    the whole CRD as over budget. `exists_one` rules out repeats (two equal elements share an index)."""
    if key is None:
        return f"{items}.isSorted() && {items}.all(x, {items}.exists_one(y, y == x))"
    return (
        f"{items}.all(x, {items}.exists_one(y, y.{key} == x.{key})) && "
        f"{items}.all(x, {items}.all(y, {items}.indexOf(x) >= {items}.indexOf(y) || x.{key} < y.{key}))"
    )


class Model(WireModel):
    """What to serve (Orloj §5 'model', Symphony D 'model', AlpaServe §5.1 identity)."""

    name: str = Field(
        min_length=1, description="Model name: the name the gateway serves it under and reports."
    )
    dynamic: bool = Field(
        default=True,
        description="Execution time varies per request (Orloj batching); false uses Symphony deferred batching.",
    )


class SLO(WireModel):
    """Latency objective: absolute, or a multiple of solo latency (Orloj x·P99; AlpaServe sloScale)."""

    latency_ms: float | None = Field(default=None, gt=0, description="End-to-end budget per request, ms.")
    p99_multiplier: float | None = Field(
        default=None, gt=0, description="SLO = x · P99 of solo time (Orloj)."
    )
    slo_scale: float | None = Field(
        default=None, gt=0, description="SLO = scale · single-device latency (AlpaServe)."
    )
    miss_cost: float = Field(default=1.0, ge=0, description="c: cost of a missed deadline (Orloj §2.1.1).")

    cross_field_rules = (
        CrossFieldRule(
            cel="[has(self.latencyMs), has(self.p99Multiplier), has(self.sloScale)].filter(x, x).size() == 1",
            message="set exactly one of latencyMs, p99Multiplier, sloScale",
            check=lambda s: sum(v is not None for v in (s.latency_ms, s.p99_multiplier, s.slo_scale)) == 1,
        ),
    )


class Traffic(WireModel):
    """Expected load: Symphony's r_i, what replicas are sized for until the gateway's load is reported."""

    expected_rps: float = Field(default=0.0, ge=0, description="Mean requests per second.")
    cv: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description=(
            "Coefficient of variation of inter-arrival times (a Gamma process; 1 = Poisson): the burstiness "
            "a serving pool's planner simulates (AlpaServe §1.4)."
        ),
    )


class LatencyModel(WireModel):
    """Batch execution time ℓ(k) (Orloj Eq. 3; Symphony ℓ(b) = αb + β)."""

    type: Literal["linear", "perBatchSize", "profile"] = Field(
        default="profile",
        description="linear: c0Ms + c1·k·(solo); perBatchSize: the perBatchSizeMs table; profile: latencyProfiles.",
    )
    c0_ms: float | None = Field(default=None, ge=0, description="Fixed cost per batch, ms (linear).")
    c1: float | None = Field(default=None, ge=0, description="Per-item factor (linear).")
    per_batch_size_ms: list[float] = Field(
        default_factory=list, max_length=MAX_BATCH_SIZES, description="ℓ(k) for each supported batch size."
    )

    cross_field_rules = (
        CrossFieldRule(
            cel="self.type != 'linear' || (has(self.c0Ms) && has(self.c1))",
            message="type linear needs c0Ms and c1",
            check=lambda s: s.type != "linear" or (s.c0_ms is not None and s.c1 is not None),
        ),
        CrossFieldRule(
            cel="self.type != 'perBatchSize' || (size(self.perBatchSizeMs) > 0 && self.perBatchSizeMs.isSorted())",
            message="type perBatchSize needs perBatchSizeMs, non-decreasing in batch size (Orloj §2.4.1)",
            check=lambda s: (
                s.type != "perBatchSize"
                or (len(s.per_batch_size_ms) > 0 and _non_decreasing(s.per_batch_size_ms))
            ),
            field_path=".perBatchSizeMs",
        ),
    )


class Batching(WireModel):
    """How requests are grouped (Orloj Alg. 1 input 𝒮; Symphony Alg. 1 and GETBATCH)."""

    supported_batch_sizes: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16],
        min_length=1,
        max_length=MAX_BATCH_SIZES,
        description="𝒮: batch sizes the runtime accepts; must contain 1 (values open in the papers).",
    )
    latency_model: LatencyModel = Field(default_factory=LatencyModel)
    timeout_ms: float | None = Field(
        default=None, ge=0, description="scheduler.policy timeout: dispatch once the oldest waited this long."
    )
    get_batch: Literal["headGreedy", "earlyDropForTarget"] = Field(
        default="earlyDropForTarget",
        description=(
            "Symphony GETBATCH: headGreedy grows the batch from the queue's head; earlyDropForTarget also drops "
            "a head that cannot finish in a batch of the target size, which keeps goodput flat under overload."
        ),
    )
    target_batch: Literal["modelRate", "clusterGpus"] = Field(
        default="modelRate",
        description=(
            "earlyDropForTarget's target batch size: modelRate solves (1 + 1/n)·l(b) <= SLO with n = r·l(b)/b "
            "the GPUs the model's own measured rate r (mean + 2 std over 5 s) needs, as Symphony's code does; "
            "clusterGpus uses n = every worker of the deployment."
        ),
    )

    cross_field_rules = (
        CrossFieldRule(
            cel=_cel_strictly_increasing("self.supportedBatchSizes"),
            message="supportedBatchSizes must be strictly increasing",
            check=lambda s: _strictly_increasing(s.supported_batch_sizes),
            field_path=".supportedBatchSizes",
        ),
        CrossFieldRule(
            cel="self.supportedBatchSizes.all(x, x >= 1) && 1 in self.supportedBatchSizes",
            message="supportedBatchSizes must be >= 1 and contain 1 (Orloj §5)",
            check=lambda s: all(x >= 1 for x in s.supported_batch_sizes) and 1 in s.supported_batch_sizes,
            field_path=".supportedBatchSizes",
        ),
        CrossFieldRule(
            cel="self.latencyModel.type != 'perBatchSize' "
            "|| size(self.latencyModel.perBatchSizeMs) == size(self.supportedBatchSizes)",
            message="latencyModel.perBatchSizeMs needs one entry per supported batch size",
            check=lambda s: (
                s.latency_model.type != "perBatchSize"
                or len(s.latency_model.per_batch_size_ms) == len(s.supported_batch_sizes)
            ),
            field_path=".latencyModel.perBatchSizeMs",
        ),
    )


class LatencyPoint(WireModel):
    """p99 batch latency at one batch size on one GPU type."""

    batch_size: int = Field(ge=1)
    latency_ms: float = Field(gt=0)


class LatencyProfile(WireModel):
    """ℓ_M(b) for one GPU type (Symphony D 'latencyProfiles')."""

    gpu_type: str = Field(
        min_length=1,
        description=(
            "GPU model as the node agent reports it, e.g. nvidia-a100-40gb; the profile of the first "
            "placement.gpuTypes entry that has one is used, else the first profile."
        ),
    )
    points: list[LatencyPoint] = Field(min_length=1, max_length=MAX_BATCH_SIZES)
    preprocess_ms: float = Field(default=0.0, ge=0)
    postprocess_ms: float = Field(default=0.0, ge=0)
    force_monotonic: bool = Field(
        default=True, description="Raise ℓ(b) to its running maximum over batch size before it is used."
    )

    cross_field_rules = (
        CrossFieldRule(
            cel=_cel_strictly_increasing("self.points", "batchSize"),
            message="points[].batchSize must be strictly increasing",
            check=lambda s: _strictly_increasing([p.batch_size for p in s.points]),
            field_path=".points",
        ),
    )


class Histogram(WireModel):
    """A discretised latency distribution (Orloj §2.1.3)."""

    bin_width_ms: float = Field(gt=0)
    masses: list[float] = Field(min_length=1, max_length=MAX_BINS, description="Probability mass per bin.")


class Parametric(WireModel):
    """A parametric solo-latency prior."""

    type: Literal["normal", "lognormal"] = "normal"
    mean_ms: float = Field(gt=0)
    std_ms: float = Field(ge=0)


class Prior(WireModel):
    """Cold-start distribution of solo execution time until the profiler has enough samples."""

    histogram: Histogram | None = None
    samples_ms: list[float] = Field(default_factory=list, max_length=MAX_BINS)
    parametric: Parametric | None = None

    cross_field_rules = (
        CrossFieldRule(
            cel="[has(self.histogram), size(self.samplesMs) > 0, has(self.parametric)].filter(x, x).size() == 1",
            message="set exactly one of histogram, samplesMs, parametric",
            check=lambda s: (
                sum((s.histogram is not None, len(s.samples_ms) > 0, s.parametric is not None)) == 1
            ),
        ),
    )


class Application(WireModel):
    """A tagged request stream with its own latency distribution (Orloj §5 'applications')."""

    id: str = Field(min_length=1, max_length=63)
    prior: Prior | None = Field(
        default=None, description="Seeds Orloj's histogram; measured times replace it."
    )


class Frontend(WireModel):
    """How the gateway tags requests (Orloj §5, engineering fields) and the ports it serves on."""

    app_id_header: str = Field(
        default="x-tessera-app",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
        description="Request header naming the application (HTTP header names are case-insensitive).",
    )
    default_app: str = Field(default="default", min_length=1, description="Application of untagged requests.")
    grpc_port: int = Field(
        default=8001,
        ge=0,
        le=65535,
        description=(
            "Port the gateway also serves the Open Inference Protocol on over gRPC (the gateway container's "
            "port and the gateway Service's port `grpc`); 0: HTTP only."
        ),
    )


class Distribution(WireModel):
    """Histogram discretisation and batch mixing (Orloj §3.2, §4.2)."""

    bin_width_ms: float | None = Field(
        default=None, gt=0, description="Unset: about 100 bins up to the priors' largest P99 (open in Orloj)."
    )
    batch_mix_mode: Literal["roundRobin", "iidMixture", "weighted"] = "roundRobin"


class Scheduler(WireModel):
    """Which batch scheduler the gateway runs, and Orloj's knobs."""

    policy: Literal["auto", "orloj", "symphony", "eager", "timeout"] = Field(
        default="auto",
        description=(
            "auto: Orloj for a dynamic model (model.dynamic) with a latency distribution (application priors "
            "or a batch profile to seed it), Symphony deferred batching for a static model with a batch "
            "profile; eager: Symphony's framework dispatching at once; timeout: dispatch a full batch or once "
            "the oldest request waited batching.timeoutMs."
        ),
    )
    anticipated_delay_rate_per_ms: float = Field(default=1e-4, gt=0, description="b in the priority score.")
    candidate_order: Literal["literalDesc", "edfThenLargest"] = "literalDesc"
    drop_estimator: str = Field(
        default="mean",
        pattern=r"^(mean|min|quantile:(0(\.[0-9]+)?|1(\.0+)?))$",
        description="mean, min or quantile:q.",
    )


class Profiler(WireModel):
    """Online learning of per-application distributions (Orloj §3)."""

    sample_rate: float = Field(default=0.02, ge=0, le=1, description="Share of finished requests sampled.")
    pickup_interval_seconds: float = Field(default=10.0, gt=0)
    window_seconds: float = Field(default=600.0, gt=0, description="Profiling memory is reset this often.")
    min_samples_per_app: int = Field(default=200, ge=1)
    max_gpu_share_percent: float = Field(
        default=5.0, ge=0, le=100, description="Cap on solo re-execution cost."
    )


class ModelMemory(WireModel):
    """Model memory for placement feasibility (Symphony MILP (5)(7); AlpaServe weights per device)."""

    static_mib: int = Field(ge=0, description="Weights, s_i.")
    dynamic_mib_at_max_batch: int = Field(
        default=0, ge=0, description="Activations at the largest batch, d_i."
    )


class Network(WireModel):
    """Network delay (Symphony Fig. 18, A.9): Symphony plans with ℓ(b) + d_ctrl + d_data·b, and every policy
    takes the response latency out of each request's SLO budget."""

    ctrl_latency_us: float = Field(default=0.0, ge=0)
    data_latency_per_item_us: float = Field(default=0.0, ge=0)
    response_latency_us: float = Field(default=0.0, ge=0)


class Placement(WireModel):
    """Where and on how many GPUs workers run: load-proportional bounds (Symphony §A.7) and GPU models."""

    gpu_types: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="GPU models (the node agent's names) workers may be placed on; empty: any.",
    )
    min_gpus: int = Field(default=1, ge=1)
    max_gpus: int = Field(default=64, ge=1)
    pool: str | None = Field(
        default=None,
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "Serving pool (AlpaServe): ModelDeployments of one namespace naming the same pool are placed "
            "jointly on groups of GPUs, each group serving several models; each member brings "
            "replicas × gpusPerReplica GPUs to the pool."
        ),
    )

    cross_field_rules = (
        CrossFieldRule(
            cel="self.minGPUs <= self.maxGPUs",
            message="minGPUs must be <= maxGPUs",
            check=lambda s: s.min_gpus <= s.max_gpus,
            field_path=".minGPUs",
        ),
    )


class ModelDeploymentSpec(WireModel):
    """Everything the serving policies need for one model."""

    template: PodTemplateSpec = Field(description="Pod template of the serving workers.")
    model: Model
    slo: SLO
    replicas: int = Field(
        default=1, ge=1, description="Initial replicas; the autoscaler moves it within placement."
    )
    gpus_per_replica: int = Field(default=1, ge=1)
    traffic: Traffic = Field(default_factory=Traffic)
    batching: Batching = Field(default_factory=Batching)
    latency_profiles: list[LatencyProfile] = Field(default_factory=list, max_length=16)
    applications: list[Application] = Field(default_factory=list, max_length=MAX_APPLICATIONS)
    frontend: Frontend = Field(default_factory=Frontend)
    distribution: Distribution = Field(default_factory=Distribution)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    profiler: Profiler = Field(default_factory=Profiler)
    memory: ModelMemory | None = None
    network: Network = Field(default_factory=Network)
    placement: Placement = Field(default_factory=Placement)
    gpu: GPUUsage = Field(default_factory=lambda: GPUUsage(workload_class="latency-critical"))

    cross_field_rules = (
        CrossFieldRule(
            cel="!has(self.placement) || (self.replicas * self.gpusPerReplica >= self.placement.minGPUs "
            "&& self.replicas * self.gpusPerReplica <= self.placement.maxGPUs)",
            message="replicas * gpusPerReplica must lie within placement.minGPUs..maxGPUs",
            check=lambda s: s.placement.min_gpus <= s.replicas * s.gpus_per_replica <= s.placement.max_gpus,
            field_path=".replicas",
        ),
        CrossFieldRule(
            cel="!has(self.memory) || !has(self.gpu) || "
            "self.memory.staticMiB + self.memory.dynamicMiBAtMaxBatch <= "
            "(has(self.gpu.lane) ? self.gpu.lane.memoryMiB : self.gpu.gpuMemoryMiB - self.gpu.reservedMiB) "
            "* self.gpusPerReplica",
            message="memory.staticMiB + dynamicMiBAtMaxBatch must fit the replica's GPUs (or its lane)",
            check=lambda s: (
                s.memory is None
                or s.memory.static_mib + s.memory.dynamic_mib_at_max_batch
                <= (s.gpu.lane.memory_mib if s.gpu.lane else s.gpu.gpu_memory_mib - s.gpu.reserved_mib)
                * s.gpus_per_replica
            ),
            field_path=".memory",
        ),
        CrossFieldRule(
            cel="!has(self.scheduler) || self.scheduler.policy != 'timeout' "
            "|| (has(self.batching) && has(self.batching.timeoutMs))",
            message="scheduler.policy timeout needs batching.timeoutMs",
            check=lambda s: s.scheduler.policy != "timeout" or s.batching.timeout_ms is not None,
            field_path=".batching.timeoutMs",
        ),
        unique_by("applications", "id", "application ids must be unique"),
    )


class PoolGroupStatus(WireModel):
    """One group of a serving pool's plan: its GPUs, parallel config and models (AlpaServe §5.2)."""

    id: str = Field(description="Group name: <pool>-g<index>.")
    gpus: int = Field(ge=1, description="GPUs of the group (pp · op), on one node.")
    pp: int = Field(ge=1, description="Inter-op (pipeline) stages.")
    op: int = Field(ge=1, description="Intra-op degree of each stage.")
    models: list[str] = Field(default_factory=list, description="Models the group serves.")
    placed: str | None = Field(
        default=None, description="Its GPUs (node/index, comma-separated) once placed."
    )
    state: Literal["Starting", "Active", "Retiring", "Draining"] = Field(
        default="Active",
        description=(
            "Starting: in the current plan, its worker coming up, not routed; Active: routed; Retiring: left "
            "out of a new plan, routed until the new groups run; Draining: out of routing, its worker goes "
            "once nothing is in flight there."
        ),
    )


class ModelDeploymentStatus(WireModel):
    """What the serving controller reports (Orloj §5 status, Symphony D status, AlpaServe §5.2)."""

    phase: Literal["Pending", "Placing", "Serving", "Failed"] = Field(
        default="Pending",
        description="Placing: no replica on a GPU yet; Serving: at least one placed; Failed: the spec is refused.",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this status reflects."
    )
    replicas: int = Field(default=0, ge=0, description="Groups or replicas holding the model.")
    gpus_assigned: int = Field(default=0, ge=0)
    groups: list[str] = Field(
        default_factory=list, description="Per replica, its GPUs (node/index, comma-separated)."
    )
    slo_latency_ms: float | None = Field(
        default=None, gt=0, description="The resolved SLO in ms (latencyMs, or the multiple of solo latency)."
    )
    policy: str | None = Field(
        default=None,
        description="The batch scheduler the gateway runs: scheduler.policy, or what auto chose.",
    )
    fitted_alpha_ms: float | None = Field(
        default=None,
        ge=0,
        description="Symphony's ℓ(b) = αb + β fit of the batch profile, α (ms per request).",
    )
    fitted_beta_ms: float | None = Field(
        default=None, ge=0, description="ℓ(b) = αb + β fit, β (ms per batch)."
    )
    # Written by the operator from the gateway's counters (GET /stats) over the window between two reads
    # (statsWindowSeconds); read back to size replicas. Absent while the gateway cannot be read.
    slo_attainment_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Share of the window's requests that met the SLO: met / (met + missed + dropped), a request the "
            "model refused as bad input counting on neither side. Absent when no request finished."
        ),
    )
    goodput_rps: float | None = Field(
        default=None, ge=0, description="Requests/s answered within their SLO over the window."
    )
    gpu_idle_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Share of the window the workers ran neither a batch nor a profiling run (by the compute "
            "time the workers report), over all configured workers."
        ),
    )
    stats_window_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Length of the window goodputRps, sloAttainmentPercent and gpuIdlePercent cover "
        "(the gateway's clock between the operator's last two reads).",
    )
    stats_requests: int | None = Field(
        default=None, ge=0, description="Requests answered in that window (the model's refusals excluded)."
    )
    observed_load_rps: float | None = Field(
        default=None,
        ge=0,
        description="Offered load goodputRps / sloAttainmentPercent, when both are reported; what replicas follow.",
    )
    pool: str | None = Field(default=None, description="The serving pool this deployment is placed in.")
    pool_groups: list[str] = Field(
        default_factory=list, description="Pool groups holding this model (ids in poolPlan)."
    )
    predicted_slo_attainment_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="The pool planner's simulated SLO attainment for this model under its plan.",
    )
    profile_synthetic: bool | None = Field(
        default=None,
        description="The planner's per-config profiles are synthetic (α-model from the batch-1 latency), not measured.",
    )
    pool_plan: list[PoolGroupStatus] = Field(
        default_factory=list,
        description="The pool's whole plan: group partition, parallel config and model set per group.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Scaled (whether the replicas wanted for the load are placed), GatewayStats (True: the gateway's "
            "counters were read and the stats fields cover the last window; False: Baseline, a first read, or "
            "Unreachable, with why), Valid (False for a refused spec), "
            "QueueResolved (only in a namespace with the tessera.io/queue label: True, QueueFound, when the label "
            "names a Queue that exists; False, QueueNotFound, when it names none, and the object is in the "
            "default queue until that Queue is created or the label is changed), "
            "and Ready: True when every replica wanted (Symphony's load-proportional count) is placed on GPUs with "
            "its worker pod created, and the gateway's ConfigMap, Deployment and Services are applied (reason "
            "Serving); False while its spec is refused (InvalidSpec), wanted replicas wait for free GPUs "
            "(WaitingForGPUs) or worker pods could not be created (PodsNotCreated)."
        ),
    )
