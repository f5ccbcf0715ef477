"""Gateway configuration: which models it serves, with which batch scheduler, on which workers.

Times are seconds. A YAML/JSON file holds ``{host, port, models: [ModelConfig...]}``; every field is
checked and an error names the field. :func:`build_scheduler` turns a model's config into the policy
object of ``tessera.policy.serving`` that forms its batches — the gateway never batches on its own.

Policy per model (``policy``):

* ``orloj`` — distribution-aware batching for data-dependent models (Orloj Algorithm 1); needs ``priors``
  (solo execution-time samples per application) and the batching ``latency`` model.
* ``symphony`` — deferred batching for static models (Symphony §3.1-3.2); needs ``symphony``
  (the linear profile ℓ(b) = α·b + β); ``symphony.timeout`` turns it into timeout batching.
* ``timeout`` (Triton's max-queue-delay), ``clockwork``, ``nexus``, ``clipper`` — the baselines of
  Orloj §5, planning with the mean solo time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tessera.api.contract import HEADER_APP
from tessera.api.safe_load import InputError, load_json_file, load_yaml_file, validated
from tessera.policy.serving.baselines.batching import (
    ClipperScheduler,
    ClockworkScheduler,
    NexusScheduler,
    TimeoutScheduler,
)
from tessera.policy.serving.common import BatchLatencyModel, BatchScheduler, LinearProfile
from tessera.policy.serving.orloj import CandidateOrder, OrlojConfig, OrlojScheduler
from tessera.policy.serving.orloj.batch_dist import MixMode
from tessera.policy.serving.symphony import SymphonyScheduler
from tessera.policy.serving.symphony.colocation import colocated_profile

Policy = Literal["orloj", "symphony", "timeout", "clockwork", "nexus", "clipper"]
POLICIES: tuple[str, ...] = ("orloj", "symphony", "timeout", "clockwork", "nexus", "clipper")


class ConfigError(ValueError):
    """A gateway configuration that cannot be used; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyConfig(_Strict):
    """Batch time l_B(k) = a_k + s_k · max solo, a_k = a0 + a1·k, s_k = s0 + s1·k (Orloj Eq. 3-4)."""

    a0: float = 0.0
    a1: float = 0.0
    s0: float = 0.0
    s1: float = 1.0
    table: dict[int, tuple[float, float]] = Field(default_factory=dict)

    def model(self) -> BatchLatencyModel:
        return BatchLatencyModel(self.a0, self.a1, self.s0, self.s1, dict(self.table))


class OrlojOptions(_Strict):
    b: float = Field(0.1, gt=0, description="anticipated-delay rate per second (the paper's 1e-4/ms)")
    miss_cost: float = Field(1.0, ge=0, description="c: cost of a missed deadline (Orloj §4.1)")
    mix_mode: Literal["round_robin", "iid_mixture", "weighted"] = "round_robin"
    drop_estimator: str = "mean"
    candidate_order: Literal["literal_desc", "edf_then_largest"] = "literal_desc"
    window_s: float = 600.0
    pickup_interval_s: float = 10.0
    min_samples: int = 200
    bin_width_s: float | None = None


class TimeoutOptions(_Strict):
    max_queue_delay_s: float = Field(0.005, ge=0)
    drop_expired: bool = True


class NexusOptions(_Strict):
    rate: float = Field(gt=0, description="expected request rate (requests/s) the batch size is planned for")


class SymphonyOptions(_Strict):
    alpha: float = Field(ge=0, description="seconds per request in a batch (ℓ(b) = α·b + β)")
    beta: float = Field(ge=0, description="fixed seconds per batch")
    timeout: float | None = Field(None, ge=0, description="None: deferred (Symphony); k: timeout batching")
    get_batch: Literal["headGreedy", "earlyDropForTarget"] = Field(
        "headGreedy", description="earlyDropForTarget sheds heads that cannot make a target-size batch"
    )
    target_batch: Literal["modelRate", "clusterGpus"] = Field(
        "modelRate",
        description="earlyDropForTarget's target: modelRate (the model's measured rate, Symphony's code) or "
        "clusterGpus (every worker)",
    )
    colocation_inflation: float = Field(
        1.0,
        ge=1.0,
        allow_inf_nan=False,
        description="workers share GPUs with best-effort lanes: plan with ℓ(b) times this (the observed "
        "HP p99 colocated / dedicated); 1 = dedicated GPUs. With observe_inflation, the value to start from",
    )
    observe_inflation: bool = Field(
        True,
        description="measure the inflation online: p99 of the workers' batch times over ℓ(b), re-planned "
        "when it leaves inflation_band (BE lanes joining or leaving the GPUs); false keeps "
        "colocation_inflation",
    )
    inflation_window: int = Field(256, ge=1, description="batches the observed inflation is taken over")
    inflation_min_samples: int = Field(50, ge=1, description="batches needed before it is used")
    inflation_band: float = Field(
        0.1, ge=0, allow_inf_nan=False, description="relative change that re-plans (hysteresis)"
    )

    @model_validator(mode="after")
    def _samples_fit_window(self) -> SymphonyOptions:
        if self.inflation_min_samples > self.inflation_window:
            raise ValueError("inflation_min_samples must not exceed inflation_window")
        return self


class ProfilerOptions(_Strict):
    """Solo re-execution of sampled finished requests (Orloj gives no defaults; these are Tessera's)."""

    sample_rate: float = Field(0.02, ge=0, le=1)
    max_share: float = Field(0.05, ge=0, le=1, description="cap on profiling time / batch time")
    max_pending: int = Field(64, ge=1, description="sampled requests kept waiting for an idle worker")


class ModelConfig(_Strict):
    name: str = Field(min_length=1)
    namespace: str = "default"
    policy: Policy
    slo_s: float = Field(gt=0, description="default latency budget when a request brings no deadline header")
    app_header: str = Field(
        HEADER_APP, min_length=1, description="request header naming the application (Orloj tags)"
    )
    default_app: str = Field("default", min_length=1, description="application of untagged requests")
    workers: list[str] = Field(min_length=1, description="worker base URLs, e.g. http://127.0.0.1:9001")
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    max_batch: int = Field(8, ge=1)
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    priors: dict[str, list[float]] = Field(default_factory=dict)
    mean_solo_s: float | None = Field(None, gt=0)
    orloj: OrlojOptions = Field(default_factory=OrlojOptions)
    timeout: TimeoutOptions = Field(default_factory=TimeoutOptions)
    nexus: NexusOptions | None = None
    symphony: SymphonyOptions | None = None
    profiler: ProfilerOptions | None = None
    max_retries: int = Field(
        1, ge=0, description="re-queue a batch's requests this often if its worker fails"
    )
    worker_timeout_s: float = Field(30.0, gt=0)
    late_grace_s: float | None = Field(None, ge=0, description="answer 504 this long after a deadline")

    @field_validator("workers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {url!r} must start with http:// or https://")
        return [u.rstrip("/") for u in v]

    @model_validator(mode="after")
    def _policy_needs(self) -> ModelConfig:
        if self.policy == "orloj" and not self.priors:
            raise ValueError("policy orloj needs 'priors': solo execution-time samples (s) per application")
        if self.policy == "symphony" and self.symphony is None:
            raise ValueError("policy symphony needs 'symphony': {alpha, beta} of its latency profile")
        if self.policy == "nexus" and self.nexus is None:
            raise ValueError("policy nexus needs 'nexus': {rate}")
        if (
            self.policy in ("timeout", "clockwork", "nexus", "clipper")
            and self.mean_solo_s is None
            and not self.priors
        ):
            raise ValueError(f"policy {self.policy} needs 'mean_solo_s' or 'priors' to estimate batch times")
        return self

    @property
    def grace(self) -> float:
        return self.late_grace_s if self.late_grace_s is not None else max(0.5, self.slo_s)

    @property
    def profiler_options(self) -> ProfilerOptions:
        """Orloj learns from solo times, so it profiles by default; the baselines do not learn."""
        if self.profiler is not None:
            return self.profiler
        return ProfilerOptions() if self.policy == "orloj" else ProfilerOptions(sample_rate=0.0)

    def mean_solo(self) -> float:
        if self.mean_solo_s is not None:
            return self.mean_solo_s
        samples = [x for xs in self.priors.values() for x in xs]
        if not samples:
            raise ConfigError(f"model {self.name}: priors hold no samples")
        return sum(samples) / len(samples)


class PoolModelConfig(_Strict):
    name: str = Field(min_length=1)
    slo_s: float = Field(gt=0, description="latency budget when a request brings no deadline header")
    deployment: str | None = Field(None, description="the ModelDeployment serving it (for reports)")


class PoolGroupConfig(_Strict):
    """One group of an AlpaServe pool: its worker, parallel config and the models it holds with their
    profiled stage latencies (s), which the router's admission check replays."""

    id: str = Field(min_length=1)
    worker: str = Field(description="the group's worker base URL")
    pp: int = Field(1, ge=1)
    op: int = Field(1, ge=1)
    models: dict[str, list[float]] = Field(
        min_length=1, description="model → stage latencies (s), pp of them"
    )

    @field_validator("worker")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"worker URL {v!r} must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _stages(self) -> PoolGroupConfig:
        for m, lat in self.models.items():
            if len(lat) != self.pp or any(not x > 0 for x in lat):
                raise ValueError(f"group {self.id}: model {m} needs pp = {self.pp} positive stage latencies")
        return self


class PoolConfig(_Strict):
    """Models served by an AlpaServe placement: routed to the group holding them with the shortest queue,
    admitted only if they can meet their SLO (AlpaServe §4.3)."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    models: list[PoolModelConfig] = Field(min_length=1)
    groups: list[PoolGroupConfig] = Field(default_factory=list)
    worker_timeout_s: float = Field(30.0, gt=0)
    fixed_overhead_s: float = Field(0.0, ge=0, description="added to every predicted finish time")
    reload_from: str | None = Field(
        None,
        description="re-read this configuration file's pool section every reload_interval_s and switch "
        "routing to its groups when they change (the operator's re-placement); None: fixed",
    )
    reload_interval_s: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _known(self) -> PoolConfig:
        names = {m.name for m in self.models}
        for g in self.groups:
            unknown = sorted(set(g.models) - names)
            if unknown:
                raise ValueError(f"group {g.id} holds models the pool does not serve: {unknown}")
        ids = [g.id for g in self.groups]
        if len(set(ids)) != len(ids):
            raise ValueError(f"group ids must be unique: {ids}")
        return self


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    grpc_port: int | None = Field(
        None, ge=0, le=65535, description="also serve gRPC on this port (same host); None: HTTP only"
    )
    health_interval_s: float = Field(0.5, gt=0)
    models: list[ModelConfig] = Field(default_factory=list)
    pool: PoolConfig | None = None

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        if not self.models and self.pool is None:
            raise ValueError("the gateway needs 'models' or a 'pool'")
        names = [m.name for m in self.models] + ([m.name for m in self.pool.models] if self.pool else [])
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"model names must be unique, repeated: {dup}")
        return self

    @classmethod
    def parse(cls, data: Mapping[str, Any], source: str = "") -> GatewayConfig:
        """The configuration in `data` (read from the file `source`, if any); a ConfigError of one line
        naming the field path otherwise."""
        try:
            return validated(cls, data, source)
        except InputError as err:
            raise ConfigError(f"gateway configuration{' ' if source else ''}{err}") from None

    @classmethod
    def load(cls, path: str | Path) -> GatewayConfig:
        p = Path(path)
        try:  # size, UTF-8, nesting depth and NaN/infinity checked: one line naming the file
            data = load_json_file(p) if p.suffix == ".json" else load_yaml_file(p)
        except InputError as err:
            raise ConfigError(f"gateway configuration {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"gateway configuration {p}: must be a mapping with 'models' or a 'pool'")
        return cls.parse(data, str(p))


def build_scheduler(cfg: ModelConfig) -> BatchScheduler | SymphonyScheduler:
    """The ``tessera.policy.serving`` object that forms this model's batches."""
    latency = cfg.latency.model()
    if cfg.policy == "orloj":
        o = cfg.orloj
        return OrlojScheduler(
            OrlojConfig(
                batch_sizes=cfg.batch_sizes,
                latency=latency,
                b=o.b,
                miss_cost=o.miss_cost,
                mix_mode=MixMode(o.mix_mode),
                bin_width=o.bin_width_s,
                candidate_order=CandidateOrder(o.candidate_order),
                drop_estimator=o.drop_estimator,
                window=o.window_s,
                pickup_interval=o.pickup_interval_s,
                min_samples=o.min_samples,
            ),
            cfg.priors,
        )
    if cfg.policy == "symphony":
        s = cfg.symphony
        assert s is not None  # checked by the model validator
        profile = colocated_profile(
            LinearProfile(s.alpha, s.beta, max_batch=cfg.max_batch), s.colocation_inflation
        )
        return SymphonyScheduler(
            {cfg.name: profile},
            len(cfg.workers),
            timeout=s.timeout,
            get_batch=s.get_batch,
            target_batch=s.target_batch,
        )
    ms = cfg.mean_solo()
    if cfg.policy == "timeout":
        t = cfg.timeout
        return TimeoutScheduler(
            latency,
            ms,
            max_batch=cfg.max_batch,
            max_queue_delay=t.max_queue_delay_s,
            drop_expired=t.drop_expired,
        )
    if cfg.policy == "clockwork":
        return ClockworkScheduler(latency, ms, batch_sizes=cfg.batch_sizes)
    if cfg.policy == "nexus":
        assert cfg.nexus is not None
        return NexusScheduler(latency, ms, slo=cfg.slo_s, rate=cfg.nexus.rate, max_batch=cfg.max_batch)
    return ClipperScheduler(latency, ms, max_batch=cfg.max_batch)
