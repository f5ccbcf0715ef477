"""A ModelDeployment as the operator sees it: replica count, worker lanes, and the gateway in front.

Replicas follow Symphony's load-proportional rule (Symphony §3.5): GPUs in proportion to the offered
load — ⌈rate / per-replica capacity⌉, the capacity being the best throughput b / ℓ(b) of a batch that
still leaves half the SLO for queueing (the paper gives no share; half is Tessera's reading of deferred
batching's budget) — and, once the gateway reports attainment and idleness in status, corrected by
`autoscale_advice` (add N·r/(1−r) when the bad rate r exceeds 1 %, release N·f of idle GPUs).
Bounds: placement.minGPUs..maxGPUs.
Each replica's worker pod gets one lane (spec.gpu.lane, else a whole GPU) on its own GPU drawn from the
GPUs no App lease, TrialGroup pool or other pod holds; the gateway is a Deployment + Service whose
config (tessera.gateway.config) lists the workers by their stable DNS names.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract
from tessera.api.modeldeployment import LatencyProfile, ModelDeploymentSpec
from tessera.api.resources import parse_modeldeployment
from tessera.controller.apps import check_name, manifest_of
from tessera.controller.pods import Owner, PodPlan
from tessera.controller.view import split_gpu_id
from tessera.gateway.config import GatewayConfig
from tessera.policy.serving.symphony import autoscale_advice

WORKER_PORT = 9001
GATEWAY_PORT = 8080
SERVICE_PORT = 80  # the gateway Service's HTTP port (→ GATEWAY_PORT); gRPC keeps frontend.grpcPort on both
CONFIG_PATH = "/etc/tessera/gateway.json"
GATEWAY_SUFFIX = "-gateway"  # <name>-gateway: the gateway's Deployment, Service and ConfigMap
WORKERS_SUFFIX = "-workers"  # <name>-workers: the headless Service naming the worker pods


def gateway_service_url(namespace: str, name: str) -> str:
    """The HTTP base URL of ModelDeployment ``name``'s gateway Service (cluster DNS)."""
    return f"http://{name}{GATEWAY_SUFFIX}.{namespace}.svc:{SERVICE_PORT}"


def latency_profile(spec: ModelDeploymentSpec) -> LatencyProfile | None:
    """The latency profile for the GPUs workers run on: the first placement.gpuTypes entry that has one,
    else the first profile."""
    by_type = {p.gpu_type: p for p in spec.latency_profiles}
    for t in spec.placement.gpu_types:
        if t in by_type:
            return by_type[t]
    return spec.latency_profiles[0] if spec.latency_profiles else None


def batch_profile(spec: ModelDeploymentSpec) -> list[tuple[int, float]]:
    """(batch size, ℓ(b) ms) from latencyModel.perBatchSizeMs or `latency_profile` (pre- and post-processing
    added; with forceMonotonic, ℓ(b) raised to its running maximum: a bigger batch never plans as faster)."""
    lm = spec.batching.latency_model
    if lm.type == "perBatchSize" and lm.per_batch_size_ms:
        return list(zip(spec.batching.supported_batch_sizes, lm.per_batch_size_ms, strict=True))
    p = latency_profile(spec)
    if p is None:
        return []
    out: list[tuple[int, float]] = []
    for pt in p.points:
        ms = pt.latency_ms + p.preprocess_ms + p.postprocess_ms
        if p.force_monotonic and out:
            ms = max(ms, out[-1][1])
        out.append((pt.batch_size, ms))
    return out


def replica_capacity_rps(spec: ModelDeploymentSpec) -> float | None:
    """Requests/s one replica serves within the SLO: max b·1000/ℓ(b) over batches with ℓ(b) ≤ SLO/2."""
    slo = spec.slo.latency_ms
    profile = batch_profile(spec)
    if slo is None or not profile:
        return None
    fits = [b * 1000.0 / ms for b, ms in profile if ms <= slo / 2]
    return max(fits) if fits else None


def linear_fit(profile: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """ℓ(b) = α·b + β by least squares (Symphony's profile form), in seconds; α, β >= 0."""
    if len(profile) == 1:
        b, ms = profile[0]
        return ms / 1000.0 / b, 0.0
    n = len(profile)
    mx = sum(b for b, _ in profile) / n
    my = sum(ms for _, ms in profile) / n
    sxx = sum((b - mx) ** 2 for b, _ in profile)
    alpha = sum((b - mx) * (ms - my) for b, ms in profile) / sxx if sxx else 0.0
    beta = my - alpha * mx
    return max(0.0, alpha) / 1000.0, max(0.0, beta) / 1000.0


_MIX_MODES = {"roundRobin": "round_robin", "iidMixture": "iid_mixture", "weighted": "weighted"}
_ORDERS = {"literalDesc": "literal_desc", "edfThenLargest": "edf_then_largest"}
PRIOR_POINTS = 200  # samples a histogram or parametric prior is expanded to (quantiles, deterministic)


class ServingSpecError(ValueError):
    """A ModelDeployment whose scheduler cannot be configured from its spec; the message says why."""


def orloj_priors(spec: ModelDeploymentSpec) -> dict[str, list[float]]:
    """Solo execution-time samples (s) per application from spec.applications[].prior: samplesMs as given,
    a histogram expanded to bin centres in proportion to mass, a parametric prior to its quantiles."""
    out: dict[str, list[float]] = {}
    for app in spec.applications:
        p = app.prior
        if p is None:
            continue
        if p.samples_ms:
            ms = list(p.samples_ms)
        elif p.histogram is not None:
            h = p.histogram
            total = sum(h.masses) or 1.0
            ms = [
                (i + 0.5) * h.bin_width_ms
                for i, m in enumerate(h.masses)
                for _ in range(round(PRIOR_POINTS * m / total))
            ]
        elif p.parametric is not None:
            ms = _quantiles(p.parametric.type, p.parametric.mean_ms, p.parametric.std_ms)
        else:
            ms = []
        ms = [x for x in ms if x > 0]
        if ms:
            out[app.id] = [x / 1000.0 for x in ms]
    return out


def _quantiles(kind: str, mean: float, std: float) -> list[float]:
    qs = [(i + 0.5) / PRIOR_POINTS for i in range(PRIOR_POINTS)]
    if std <= 0:
        return [mean] * PRIOR_POINTS
    if kind == "lognormal":  # mean/std of the distribution itself, not of its log
        s2 = math.log(1 + (std / mean) ** 2)
        nd = statistics.NormalDist(math.log(mean) - s2 / 2, math.sqrt(s2))
        return [math.exp(nd.inv_cdf(q)) for q in qs]
    nd = statistics.NormalDist(mean, std)
    return [max(0.0, nd.inv_cdf(q)) for q in qs]


def has_distribution(spec: ModelDeploymentSpec) -> bool:
    """A data-dependent model: marked dynamic and with a distribution to seed Orloj (application priors, or
    a batch profile whose batch-1 time seeds a histogram the gateway then learns from measured solo times)."""
    return spec.model.dynamic and (bool(orloj_priors(spec)) or bool(batch_profile(spec)))


def choose_policy(spec: ModelDeploymentSpec) -> str:
    """spec.scheduler.policy, or for `auto`: Orloj for a model with a latency distribution, Symphony for a
    static one with a batch profile, else timeout batching (nothing to plan with)."""
    want = spec.scheduler.policy
    profile = batch_profile(spec)
    if want == "auto":
        if has_distribution(spec):
            return "orloj"
        return "symphony" if profile else "timeout"
    if want in ("symphony", "eager") and not profile:
        raise ServingSpecError(
            f"scheduler.policy {want} needs a batch profile: batching.latencyModel perBatchSize or latencyProfiles"
        )
    if want == "orloj" and not (orloj_priors(spec) or profile):
        raise ServingSpecError(
            "scheduler.policy orloj needs a distribution to start from: applications[].prior or a batch profile"
        )
    return want


def resolve_slo_ms(
    spec: ModelDeploymentSpec, profile: Sequence[tuple[int, float]], priors: Mapping[str, list[float]]
) -> float:
    """latencyMs; or p99Multiplier × the P99 solo time (priors, else ℓ(1)); or sloScale × ℓ(1)."""
    slo = spec.slo
    if slo.latency_ms is not None:
        return slo.latency_ms
    solo = sorted(x * 1000.0 for xs in priors.values() for x in xs)
    base = solo[min(len(solo) - 1, int(0.99 * len(solo)))] if solo else profile[0][1] if profile else None
    mult = slo.p99_multiplier if slo.p99_multiplier is not None else slo.slo_scale
    if base is None or mult is None:
        raise ServingSpecError(
            "slo needs latencyMs, or a prior or batch profile to scale p99Multiplier/sloScale by"
        )
    return mult * base


def orloj_latency(spec: ModelDeploymentSpec, profile: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """Batch time l_B(k) = a_k + s_k·max solo (Orloj Eq. 3-4): latencyModel linear gives Eq. 3
    (a = c0, s_k = c1·k); a per-batch-size profile gives s_k = ℓ(k)/ℓ(1) (not in the paper: a batch costs
    its longest member's solo time scaled as the profile scales); none: s_k = k (no batching gain assumed)."""
    lm = spec.batching.latency_model
    if lm.type == "linear" and lm.c0_ms is not None and lm.c1 is not None:
        return {"a0": lm.c0_ms / 1000.0, "s0": 0.0, "s1": lm.c1}
    if profile:
        l1 = profile[0][1]
        return {"a0": 0.0, "s0": 0.0, "s1": 0.0, "table": {str(b): [0.0, ms / l1] for b, ms in profile}}
    return {"a0": 0.0, "s0": 0.0, "s1": 1.0}


def spec_status(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """Status the spec alone determines: the resolved SLO, the scheduler the gateway runs and, for Symphony,
    its ℓ(b) = αb + β fit in ms. Empty where the spec cannot be configured (the gateway pass reports why)."""
    try:
        policy = choose_policy(spec)
        profile = batch_profile(spec)
        out: dict[str, Any] = {
            "sloLatencyMs": round(resolve_slo_ms(spec, profile, orloj_priors(spec)), 6),
            "policy": policy,
            "fittedAlphaMs": None,  # None: removed by the merge patch once the policy is not Symphony
            "fittedBetaMs": None,
        }
    except ServingSpecError:
        return {}
    if policy in ("symphony", "eager"):
        alpha, beta = linear_fit(profile)
        out["fittedAlphaMs"], out["fittedBetaMs"] = round(alpha * 1000.0, 6), round(beta * 1000.0, 6)
    return out


@dataclass(slots=True)
class ScaleDecision:
    replicas: int
    load_rps: float
    reason: str
    observed: bool = False  # load_rps came from the gateway's report, not spec.traffic.expectedRps


def observed_load(status: Mapping[str, Any]) -> float | None:
    """The offered rate the gateway saw over its last window (goodputRps over sloAttainmentPercent), or
    None when it has not reported one."""
    goodput, attained = status.get("goodputRps"), status.get("sloAttainmentPercent")
    if isinstance(goodput, int | float) and isinstance(attained, int | float) and attained > 0:
        return float(goodput) / (float(attained) / 100)
    return None


def desired_replicas(spec: ModelDeploymentSpec, status: Mapping[str, Any], current: int) -> ScaleDecision:
    """Symphony's load-proportional count from the load (observed: the gateway's goodputRps over its
    sloAttainmentPercent, i.e. the offered rate; else spec.traffic.expectedRps), then its bad-rate/idle
    advice when the gateway reports attainment and idleness."""
    per = spec.gpus_per_replica
    lo = math.ceil(spec.placement.min_gpus / per)
    hi = max(lo, spec.placement.max_gpus // per)
    seen = observed_load(status)
    load, observed = (seen, True) if seen is not None else (spec.traffic.expected_rps, False)
    cap = replica_capacity_rps(spec)
    if cap is None or load <= 0:
        want, reason = spec.replicas, "spec.replicas (no latency profile or load to scale by)"
    else:
        want = math.ceil(load / cap - 1e-9)
        reason = f"load {load:g} rps / {cap:g} rps per replica"
    attained, idle = status.get("sloAttainmentPercent"), status.get("gpuIdlePercent")
    if current > 0 and isinstance(attained, int | float) and isinstance(idle, int | float):
        bad = min(0.99, max(0.0, 1 - attained / 100))
        advice = autoscale_advice(current * per, bad, min(1.0, max(0.0, idle / 100)))
        if advice:
            adjusted = current + (math.ceil(advice / per) if advice > 0 else -(-advice // per))
            if advice > 0 and adjusted > want:
                want, reason = adjusted, f"Symphony advice +{advice} GPUs (bad rate {bad:.1%})"
            elif advice < 0 and adjusted >= want and adjusted < current:
                want, reason = adjusted, f"Symphony advice {advice} GPUs (idle {idle:g}%)"
    return ScaleDecision(min(hi, max(lo, want)), load, reason, observed)


@dataclass(slots=True)
class ServingRecord:
    namespace: str
    name: str
    uid: str
    spec: ModelDeploymentSpec
    body: Mapping[str, Any]
    gpus: list[list[str]] = field(default_factory=list)  # per replica: its GPUs
    # GPUs of replicas the queue's share has room for but that no free GPU could take (see TrialGroupRecord).
    waiting_gpus: int = 0
    since: float = 0.0  # when replicas were last placed (a queue's minimum runtime counts from here)
    # Replicas' GPUs it waits for (for the Queue's status, whatever the cause), why (queue_status' reasons)
    # and since when.
    wants: int = 0
    wait_reason: str = ""
    wait_message: str = ""
    waiting_since: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def workers_service(self) -> str:
        return self.name + WORKERS_SUFFIX

    def held(self) -> set[str]:
        return {g for gs in self.gpus for g in gs}

    def lane(self) -> tuple[int | None, int | None]:
        lane = self.spec.gpu.lane
        return (lane.memory_mib, lane.compute_percent) if lane is not None else (None, None)

    def pod_plans(self) -> list[PodPlan]:
        mem, compute = self.lane()
        plans = []
        for i, gs in enumerate(self.gpus):
            node = split_gpu_id(gs[0])[0]
            plans.append(
                PodPlan(
                    node=node,
                    gpu_indices=tuple(split_gpu_id(g)[1] for g in gs),
                    labels={
                        contract.LABEL_MODELDEPLOYMENT: self.name,
                        contract.LABEL_ROLE: "worker",
                    },
                    env={contract.ENV_MODEL: self.spec.model.name, contract.ENV_REPLICA: str(i)},
                    workload=contract.WORKLOAD_SERVING,
                    memory_mib=mem,
                    compute_percent=compute,
                    base=f"{self.name}-w{i}",
                )
            )
        return plans

    def worker_url(self, pod_name: str) -> str:
        return f"http://{pod_name}.{self.workers_service}.{self.namespace}.svc:{WORKER_PORT}"

    def gateway_config(self) -> dict[str, Any]:
        """The gateway's config (validated by tessera.gateway.config) for the policy `choose_policy` picks."""
        spec = self.spec
        policy = choose_policy(spec)
        profile = batch_profile(spec)
        priors = orloj_priors(spec)
        slo_ms = resolve_slo_ms(spec, profile, priors)
        model: dict[str, Any] = {
            "name": spec.model.name,
            "namespace": self.namespace,
            # Symphony Fig. 18: the response's trip back comes out of every request's budget.
            "slo_s": max(1e-6, slo_ms - spec.network.response_latency_us / 1000.0) / 1000.0,
            "workers": [self.worker_url(p.name) for p in self.pod_plans()],
            "batch_sizes": list(spec.batching.supported_batch_sizes),
            "max_batch": max(spec.batching.supported_batch_sizes),
            "app_header": spec.frontend.app_id_header.lower(),
            "default_app": spec.frontend.default_app,
            "policy": "symphony" if policy == "eager" else policy,
        }
        if policy in ("symphony", "eager"):
            model["symphony"] = _symphony_settings(spec, policy, profile)
        elif policy == "orloj":
            model.update(_orloj_settings(spec, profile, priors))
        else:
            model.update(_timeout_settings(spec, profile, priors, slo_ms))
        config: dict[str, Any] = {"host": "0.0.0.0", "port": GATEWAY_PORT, "models": [model]}
        if spec.frontend.grpc_port:
            config["grpc_port"] = spec.frontend.grpc_port
        GatewayConfig.model_validate(config)
        return config

    def gateway_objects(self, owner: Owner, image: str) -> list[tuple[str, dict[str, Any]]]:
        """(kind, manifest) of the gateway: ConfigMap, Deployment, Service, and the workers' headless
        Service that gives each worker pod its DNS name."""
        selector = {contract.LABEL_MODELDEPLOYMENT: self.name, contract.LABEL_ROLE: "gateway"}
        meta = {
            "namespace": self.namespace,
            "labels": {**selector, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
            "ownerReferences": [owner.reference()],
        }
        config = json.dumps(self.gateway_config(), sort_keys=True)
        # A new config rolls the gateway out. sha256, not hash(): str hashes differ between processes, so
        # every operator restart rolled out every gateway for an unchanged config.
        digest = hashlib.sha256(config.encode()).hexdigest()[:16]
        workers = {contract.LABEL_MODELDEPLOYMENT: self.name, contract.LABEL_ROLE: "worker"}
        return gateway_manifests(
            self.name + GATEWAY_SUFFIX,
            meta,
            selector,
            config,
            image,
            (self.workers_service, workers),
            grpc_port=self.spec.frontend.grpc_port,
            pod_annotations={"tessera.io/config-digest": digest},
        )


def gateway_manifests(
    name: str,
    meta: dict[str, Any],
    selector: dict[str, str],
    config: str,
    image: str,
    workers: tuple[str, dict[str, str]],
    *,
    grpc_port: int | None = None,
    pod_annotations: dict[str, str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(kind, manifest) of a gateway called ``name`` (a deployment's or a pool's): the ConfigMap holding
    ``config``, the Deployment running it, its Service, and the headless Service (``workers``: name and
    selector) that gives each worker pod its DNS name. ``meta``: namespace, labels, ownerReferences."""
    ports: list[dict[str, Any]] = [{"containerPort": GATEWAY_PORT, "name": "http"}]
    service_ports: list[dict[str, Any]] = [{"name": "http", "port": SERVICE_PORT, "targetPort": GATEWAY_PORT}]
    if grpc_port:  # the gateway serves it from its config's grpc_port
        ports.append({"containerPort": grpc_port, "name": "grpc"})
        service_ports.append(
            {"name": "grpc", "port": grpc_port, "targetPort": grpc_port, "appProtocol": "grpc"}
        )
    pod_meta: dict[str, Any] = {"labels": meta["labels"]}
    if pod_annotations is not None:
        pod_meta["annotations"] = pod_annotations
    workers_name, workers_selector = workers
    deployment = _deployment_spec(name, selector, pod_meta, image, ports)
    headless = {
        "clusterIP": "None",
        "selector": workers_selector,
        "ports": [{"name": "http", "port": WORKER_PORT}],
    }
    return [
        ("configmaps", _manifest("v1", "ConfigMap", name, meta, data={"gateway.json": config})),
        ("deployments", _manifest("apps/v1", "Deployment", name, meta, spec=deployment)),
        (
            "services",
            _manifest("v1", "Service", name, meta, spec={"selector": selector, "ports": service_ports}),
        ),
        ("services", _manifest("v1", "Service", workers_name, meta, spec=headless)),
    ]


def _manifest(api_version: str, kind: str, name: str, meta: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, **meta}, **body}


def _deployment_spec(
    name: str, selector: dict[str, str], pod_meta: dict[str, Any], image: str, ports: list[dict[str, Any]]
) -> dict[str, Any]:
    """One gateway pod running ``gateway --config`` on the ConfigMap ``name`` mounted at CONFIG_PATH."""
    return {
        "replicas": 1,
        "selector": {"matchLabels": selector},
        "template": {
            "metadata": pod_meta,
            "spec": {
                "containers": [
                    {
                        "name": "gateway",
                        "image": image,
                        # The image has no entrypoint (its CMD is `tessera --help`): args alone would run
                        # `gateway` as a program.
                        "command": ["tessera"],
                        "args": ["gateway", "--config", CONFIG_PATH],
                        "ports": ports,
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/tessera"}],
                    }
                ],
                "volumes": [{"name": "config", "configMap": {"name": name}}],
                # Placed like every pod of the operator's (pods.build_pod), reserved GPU nodes included.
                "schedulerName": contract.SCHEDULER_NAME,
                "tolerations": [contract.gpu_node_toleration()],
            },
        },
    }


def _symphony_settings(
    spec: ModelDeploymentSpec, policy: str, profile: Sequence[tuple[int, float]]
) -> dict[str, Any]:
    """The gateway's `symphony` section: the ℓ(b) = αb + β fit, with the network's delay folded in."""
    alpha, beta = linear_fit(profile)
    net = spec.network
    # delay(bs) = d_ctrl + d_data·bs is paid before the batch can start (Symphony Fig. 18): fold it into ℓ(b).
    return {
        "alpha": alpha + net.data_latency_per_item_us / 1e6,
        "beta": beta + net.ctrl_latency_us / 1e6,
        "timeout": 0.0 if policy == "eager" else None,
        "get_batch": spec.batching.get_batch,
        "target_batch": spec.batching.target_batch,
    }


def _orloj_settings(
    spec: ModelDeploymentSpec, profile: Sequence[tuple[int, float]], priors: dict[str, list[float]]
) -> dict[str, Any]:
    """The gateway model's Orloj keys: priors (ℓ(1) for the default app without any), the batch-time model,
    the scheduler's knobs and the online profiler's."""
    sch, dist, prof = spec.scheduler, spec.distribution, spec.profiler
    return {
        "priors": priors or {spec.frontend.default_app: [profile[0][1] / 1000.0]},
        "latency": orloj_latency(spec, profile),
        "orloj": {
            "b": sch.anticipated_delay_rate_per_ms * 1000.0,
            "miss_cost": spec.slo.miss_cost,
            "mix_mode": _MIX_MODES[dist.batch_mix_mode],
            "candidate_order": _ORDERS[sch.candidate_order],
            "drop_estimator": sch.drop_estimator,
            "window_s": prof.window_seconds,
            "pickup_interval_s": prof.pickup_interval_seconds,
            "min_samples": prof.min_samples_per_app,
            "bin_width_s": dist.bin_width_ms / 1000.0 if dist.bin_width_ms is not None else None,
        },
        "profiler": {"sample_rate": prof.sample_rate, "max_share": prof.max_gpu_share_percent / 100.0},
    }


def _timeout_settings(
    spec: ModelDeploymentSpec,
    profile: Sequence[tuple[int, float]],
    priors: dict[str, list[float]],
    slo_ms: float,
) -> dict[str, Any]:
    """The gateway model's keys for Triton-style max-queue-delay batching, planned on the mean solo time
    (of the priors, else ℓ(1), else a quarter of the SLO)."""
    out: dict[str, Any] = {"timeout": {"max_queue_delay_s": (spec.batching.timeout_ms or 0.0) / 1000.0}}
    samples = [x for xs in priors.values() for x in xs]
    out["mean_solo_s"] = (
        sum(samples) / len(samples) if samples else profile[0][1] / 1000.0 if profile else slo_ms / 4000.0
    )
    if profile or priors:
        out["latency"] = orloj_latency(spec, profile)
    return out


def record_from_body(body: Mapping[str, Any]) -> ServingRecord:
    """Parse a ModelDeployment (raises ManifestError) and recover its replicas' GPUs from status."""
    check_name(body, contract.LABEL_MODELDEPLOYMENT, services=(GATEWAY_SUFFIX, WORKERS_SUFFIX))
    md = parse_modeldeployment(manifest_of(body))
    meta = body["metadata"]
    rec = ServingRecord(
        str(meta.get("namespace", "")), str(meta["name"]), str(meta.get("uid", "")), md.spec, body
    )
    for group in (body.get("status") or {}).get("groups") or []:
        gs = [g for g in str(group).split(",") if "/" in g]
        if gs:
            rec.gpus.append(gs)
    return rec
