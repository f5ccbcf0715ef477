"""Orion's experiments on the kernel-level model: one HP client and BE clients on one GPU under each policy.

Use cases (Orion §6.1): `inf-train` (HP inference, Poisson or uniform arrivals, BE training, closed loop),
`train-train` (both training) and `inf-inf` (``be_role="inference"``: BE inference clients with their own
Poisson or uniform arrivals at Table 3's inf-inf rates, Orion §6.2.3). Metrics as in the paper: HP p50/p95/p99 latency (request latency, or iteration
time for a training HP) and its ratio to the dedicated (ideal) run; BE throughput in iterations/s, its ratio
to a dedicated GPU, and the cost saving `2·Throughput_collocated / Throughput_dedicated` (Orion §6.2.1); SM,
compute and memory-bandwidth utilisation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tessera.policy.orion.cooperative import ThrottleRule
from tessera.policy.orion.listing1 import OrionConfig
from tessera.policy.orion.profiles import KernelShare, cost_saving, initial_be_percent

from .gpu import ClientSpec, GpuSim, KernelScheduler
from .kernels import Kernel, Role, mix
from .schedulers import FreeForAll, Orion, Reef, Temporal, TesseraNode

POLICIES = ("dedicated", "temporal", "mps", "streams", "reef", "orion", "tessera", "tessera-caps")
# Orion Table 3 [O:L264-L272]: requests/s of each inference model in inf-inf (uniform, Poisson) and inf-train.
INF_INF_RPS: dict[str, dict[str, float]] = {
    "resnet50": {"uniform": 80, "poisson": 50},
    "mobilenetv2": {"uniform": 100, "poisson": 65},
    "resnet101": {"uniform": 40, "poisson": 25},
    "bert": {"uniform": 8, "poisson": 5},
    "transformer": {"uniform": 20, "poisson": 12},
}
# Orion Table 3, inf-train column (Poisson): the HP inference model's requests/s beside a BE training job.
INF_TRAIN_RPS: dict[str, float] = {
    "resnet50": 15,
    "mobilenetv2": 40,
    "resnet101": 9,
    "bert": 4,
    "transformer": 8,
}
# The five BE training jobs of Table 3 that each inf-train bar of Figs. 6-7 is averaged over (Orion §6.2.1).
TRAINING_JOBS = ("resnet50", "mobilenetv2", "resnet101", "bert", "transformer")
ABLATION = ("mps", "priorities", "orion-profiles", "orion")  # §6.4 Fig. 14 order; its first bar is
# streams at default priority, which the model treats like MPS (no priority)


class ExperimentError(ValueError):
    pass


@dataclass(frozen=True)
class Collocation:
    hp_model: str = "resnet50"
    hp_role: Role = "inference"
    be_models: tuple[str, ...] = ("resnet50",)
    be_role: Role = "training"  # "inference": inf-inf, each BE client open loop at its Table 3 inf-inf rate
    rate_rps: float = 15.0  # Table 3, inf-train Poisson, ResNet50
    arrival: Literal["poisson", "uniform"] = "poisson"
    requests: int = 400  # HP requests (inference) or iterations (training) measured
    warmup_requests: int = 20
    num_sms: int = 80
    seed: int = 0
    # Policy knobs.
    dur_threshold: float = 0.025  # fraction of the HP latency (Orion §5.1.1)
    sm_threshold: int | None = None  # None: all SMs
    be_percent: int | None = None  # Tessera's BE MPS cap; None: p_be0 from the HP profile
    tessera_priority: bool = True  # whether MPS client priority is honoured
    idle_depth: int = 12
    # Training HP: Orion bisects SM_THRESHOLD against this multiple of the dedicated iteration time (Orion §5.1.1)
    # (unless sm_threshold is set). A knob: the paper reports HP within 16% of ideal in train-train.
    hp_limit_factor: float = 1.15
    # Host-side gap between a training job's iterations, as a fraction of its GPU time (data loading, Python):
    # an assumption (the paper does not give it); during it a training HP leaves the GPU to BE work.
    iteration_gap: float = 0.02

    def __post_init__(self) -> None:
        if self.rate_rps <= 0 or self.requests < 10 or self.warmup_requests < 0:
            raise ExperimentError("rate_rps must be positive and requests at least 10")
        if not self.be_models:
            raise ExperimentError("at least one BE model is needed")
        if self.be_role == "inference":
            if self.hp_role != "inference":
                raise ExperimentError("BE inference (inf-inf) needs an inference HP")
            unknown = [m for m in self.be_models if m not in INF_INF_RPS]
            if unknown:
                raise ExperimentError(f"no inf-inf rate (Orion Table 3) for BE model(s) {unknown}")


@dataclass
class PolicyResult:
    policy: str
    hp_p50: float
    hp_p95: float
    hp_p99: float
    hp_jobs: int
    be_throughput: list[float]  # iterations/s per BE client
    sm_util: float
    compute_util: float
    membw_util: float
    events: int
    ratio_p99: float = 0.0  # to dedicated
    ratio_p95: float = 0.0
    be_ratio: float = 0.0  # Σ BE throughput / Σ dedicated BE throughput (mean over clients)
    cost_saving: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class ExperimentResult:
    workload: Collocation
    hp_latency_dedicated: float
    be_dedicated: list[float]
    results: dict[str, PolicyResult] = field(default_factory=dict)
    be_percent: int = 0


def _arrivals(w: Collocation, rng: random.Random, n: int) -> tuple[float, ...]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(w.rate_rps) if w.arrival == "poisson" else 1.0 / w.rate_rps
        out.append(t)
    return tuple(out)


def _be_arrivals(w: Collocation, model: str, i: int, until: float) -> tuple[float, ...]:
    """A BE inference client's arrivals up to ``until``: Table 3's inf-inf rate, Poisson or uniform as the HP's."""
    rate = INF_INF_RPS[model][w.arrival]
    rng = random.Random(f"{w.seed}/be/{i}")
    t, out = 0.0, list[float]()
    while True:
        t += rng.expovariate(rate) if w.arrival == "poisson" else 1.0 / rate
        if t >= until:
            return tuple(out)
        out.append(t)


def _clients(w: Collocation) -> tuple[ClientSpec, list[ClientSpec]]:
    rng = random.Random(w.seed)
    hp_k = mix(w.hp_model, w.hp_role, w.seed, w.num_sms)
    n = w.requests + w.warmup_requests
    arrivals = _arrivals(w, rng, n) if w.hp_role == "inference" else None
    if w.be_role == "inference" and arrivals is None:
        raise ExperimentError("BE inference (inf-inf) needs an inference HP")

    def gap(ks: tuple[Kernel, ...]) -> float:
        return w.iteration_gap * sum(k.duration for k in ks)

    hp_gap = gap(hp_k) if arrivals is None else 0.0
    hp = ClientSpec(f"{w.hp_model}-{w.hp_role}", True, hp_k, arrivals, gap_s=hp_gap)
    be = []
    for i, m in enumerate(w.be_models):
        ks = mix(m, w.be_role, w.seed + 1 + i, w.num_sms)
        if w.be_role == "inference":
            assert arrivals is not None
            be_arr = _be_arrivals(w, m, i, arrivals[-1] + 0.05)
            be.append(ClientSpec(f"{m}-inference-{i}", False, ks, be_arr))
        else:
            be.append(ClientSpec(f"{m}-training-{i}", False, ks, gap_s=gap(ks)))
    return hp, be


def _horizon(w: Collocation, hp: ClientSpec) -> tuple[float, float]:
    """(warmup, horizon): inference by the arrival times, training by HP iterations at dedicated speed."""
    if hp.arrivals is not None:
        return hp.arrivals[w.warmup_requests - 1] if w.warmup_requests else 0.0, hp.arrivals[-1] + 0.05
    it = sum(k.duration for k in hp.kernels) + hp.gap_s
    return w.warmup_requests * it, (w.warmup_requests + w.requests) * it


def make_scheduler(policy: str, w: Collocation, hp_latency: float, be_percent: int) -> KernelScheduler:
    cfg = OrionConfig(w.num_sms, w.sm_threshold, w.dur_threshold)
    rule = ThrottleRule.for_hp_latency(hp_latency, w.dur_threshold, w.idle_depth)
    match policy:
        case "dedicated" | "mps":
            return FreeForAll(policy, priority=False)
        case "streams":
            return FreeForAll("streams", priority=True)  # GPU Streams: HP on a high-priority stream
        case "priorities":
            return FreeForAll("priorities", priority=True)
        case "temporal":
            return Temporal()
        case "reef":
            return Reef()
        case "orion":
            limit = (
                w.hp_limit_factor * hp_latency if w.hp_role == "training" and w.sm_threshold is None else None
            )
            return Orion(hp_latency, cfg, hp_limit=limit)
        case "orion-profiles":
            return Orion(hp_latency, OrionConfig(w.num_sms, w.sm_threshold, w.dur_threshold, use_sm_size=False),
                         name="orion-profiles")  # fmt: skip
        case "tessera":
            return TesseraNode(be_percent, rule, priority=w.tessera_priority)
        case "tessera-caps":
            return TesseraNode(be_percent, None, priority=w.tessera_priority, name="tessera-caps")
    raise ExperimentError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES + ABLATION)}")


def _percentiles(c_lat: list[tuple[float, float]], warmup: float, pending: list[float], horizon: float
                 ) -> tuple[float, float, float, int]:  # fmt: skip
    lat = [x for a, x in c_lat if a >= warmup] + [horizon - a for a in pending if a >= warmup]
    if not lat:
        return float("inf"), float("inf"), float("inf"), 0
    p50, p95, p99 = np.percentile(np.array(lat), [50, 95, 99])
    return float(p50), float(p95), float(p99), len(lat)


def run_one(policy: str, w: Collocation, hp_latency: float = 0.0, be_percent: int = 50) -> PolicyResult:
    hp, be = _clients(w)
    clients = [hp] if policy == "dedicated" else [hp, *be]
    sched = make_scheduler(policy, w, hp_latency or sum(k.duration for k in hp.kernels), be_percent)
    sim = GpuSim(clients, sched, w.num_sms)
    warmup, horizon = _horizon(w, hp)
    sim.run(warmup, warmup)
    be_start = [c.progress() for c in sim.be]
    sim.run(horizon, warmup)
    span = horizon - warmup
    h = sim.hp
    assert h is not None
    unfinished = list(h.pending) + ([h.job_arrival] if h.job_active else [])
    if hp.arrivals is None:
        unfinished = []  # a training HP is measured by completed iterations
    p50, p95, p99, n = _percentiles(h.latencies, warmup, unfinished, horizon)
    return PolicyResult(
        policy, p50, p95, p99, n,
        [(c.progress() - s) / span for c, s in zip(sim.be, be_start, strict=True)],
        sim.usage.sm_s / span, sim.usage.compute_s / span, sim.usage.membw_s / span, sim.events,
    )  # fmt: skip


def run_experiment(w: Collocation, policies: tuple[str, ...] = POLICIES) -> ExperimentResult:
    hp, be = _clients(w)
    hp_latency = sum(k.duration for k in hp.kernels)  # the HP request latency alone, from its profile
    be_percent = w.be_percent or initial_be_percent(
        [KernelShare(k.duration, min(1.0, k.sm_needed / w.num_sms)) for k in hp.kernels]
    )
    ded = run_one("dedicated", w, hp_latency, be_percent)
    be_ded = []
    warmup, horizon = _horizon(w, hp)
    for spec in be:
        sim = GpuSim([spec], FreeForAll("dedicated"), w.num_sms)
        if spec.arrivals is not None:  # open loop: requests served per second on a GPU of its own
            sim.run(warmup, warmup)
            start = spec_progress(sim)
            sim.run(horizon, warmup)
            be_ded.append((spec_progress(sim) - start) / (horizon - warmup))
            continue
        it = sum(k.duration for k in spec.kernels) + spec.gap_s
        sim.run(20 * it)
        be_ded.append(spec_progress(sim) / (20 * it))
    res = ExperimentResult(w, ded.hp_p99, be_ded, be_percent=be_percent)
    for p in policies:
        r = ded if p == "dedicated" else run_one(p, w, hp_latency, be_percent)
        r.ratio_p99 = r.hp_p99 / ded.hp_p99
        r.ratio_p95 = r.hp_p95 / ded.hp_p95
        if r.be_throughput:
            r.be_ratio = float(np.mean([x / d for x, d in zip(r.be_throughput, be_ded, strict=True)]))
            r.cost_saving = cost_saving(r.be_throughput[0], be_ded[0])
        res.results[p] = r
    return res


def spec_progress(sim: GpuSim) -> float:
    return sim.clients[0].progress()


def hp_kernels(w: Collocation) -> tuple[Kernel, ...]:
    return _clients(w)[0].kernels
