"""A ModelDeployment as the operator sees it: replica count, worker lanes, and the gateway in front.

Replicas follow Symphony's load-proportional rule (seed-symphony-orion part A.7-A.8): GPUs in proportion
to the offered load — ⌈rate / per-replica capacity⌉, the capacity being the best throughput b / ℓ(b) of a
batch that still leaves half the SLO for queueing ([OURS] reading of deferred batching's budget) — and,
once the gateway reports attainment and idleness in status, corrected by `autoscale_advice` (add N·r/(1−r)
when the bad rate r exceeds 1 %, release N·f of idle GPUs). Bounds: placement.minGPUs..maxGPUs.
Each replica's worker pod gets one lane (spec.gpu.lane, else a whole GPU) on its own GPU drawn from the
GPUs no App lease, TrialGroup pool or other pod holds; the gateway is a Deployment + Service whose
config (tessera.gateway.config) lists the workers by their stable DNS names.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract
from tessera.api.modeldeployment import ModelDeploymentSpec
from tessera.api.resources import parse_modeldeployment
from tessera.controller.apps import check_name, manifest_of
from tessera.controller.pods import Owner, PodPlan
from tessera.controller.view import split_gpu_id
from tessera.gateway.config import GatewayConfig
from tessera.policy.serving.symphony import autoscale_advice

WORKER_PORT = 9001
GATEWAY_PORT = 8080
CONFIG_PATH = "/etc/tessera/gateway.json"
GATEWAY_SUFFIX = "-gateway"  # <name>-gateway: the gateway's Deployment, Service and ConfigMap
WORKERS_SUFFIX = "-workers"  # <name>-workers: the headless Service naming the worker pods


def batch_profile(spec: ModelDeploymentSpec) -> list[tuple[int, float]]:
    """(batch size, ℓ(b) ms) from latencyModel.perBatchSizeMs or the first latency profile."""
    lm = spec.batching.latency_model
    if lm.type == "perBatchSize" and lm.per_batch_size_ms:
        return list(zip(spec.batching.supported_batch_sizes, lm.per_batch_size_ms, strict=True))
    if spec.latency_profiles:
        p = spec.latency_profiles[0]
        return [(pt.batch_size, pt.latency_ms + p.preprocess_ms + p.postprocess_ms) for pt in p.points]
    return []


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


@dataclass(slots=True)
class Decision:
    replicas: int
    load_rps: float
    reason: str
    observed: bool = False  # load_rps came from the gateway's report, not spec.traffic.expectedRps


def desired_replicas(spec: ModelDeploymentSpec, status: Mapping[str, Any], current: int) -> Decision:
    """Symphony's load-proportional count from the load (observed: the gateway's goodputRps over its
    sloAttainmentPercent, i.e. the offered rate; else spec.traffic.expectedRps), then its bad-rate/idle
    advice when the gateway reports attainment and idleness."""
    per = spec.gpus_per_replica
    lo = math.ceil(spec.placement.min_gpus / per)
    hi = max(lo, spec.placement.max_gpus // per)
    goodput, attained = status.get("goodputRps"), status.get("sloAttainmentPercent")
    if isinstance(goodput, int | float) and isinstance(attained, int | float) and attained > 0:
        load, observed = float(goodput) / (float(attained) / 100), True
    else:
        load, observed = spec.traffic.expected_rps, False
    cap = replica_capacity_rps(spec)
    if cap is None or load <= 0:
        want, reason = spec.replicas, "spec.replicas (no latency profile or load to scale by)"
    else:
        want = math.ceil(load / cap - 1e-9)
        reason = f"load {load:g} rps / {cap:g} rps per replica"
    idle = status.get("gpuIdlePercent")
    if current > 0 and isinstance(attained, int | float) and isinstance(idle, int | float):
        bad = min(0.99, max(0.0, 1 - attained / 100))
        advice = autoscale_advice(current * per, bad, min(1.0, max(0.0, idle / 100)))
        if advice:
            adjusted = current + (math.ceil(advice / per) if advice > 0 else -(-advice // per))
            if advice > 0 and adjusted > want:
                want, reason = adjusted, f"Symphony advice +{advice} GPUs (bad rate {bad:.1%})"
            elif advice < 0 and adjusted >= want and adjusted < current:
                want, reason = adjusted, f"Symphony advice {advice} GPUs (idle {idle:g}%)"
    return Decision(min(hi, max(lo, want)), load, reason, observed)


@dataclass(slots=True)
class ServingRecord:
    namespace: str
    name: str
    uid: str
    spec: ModelDeploymentSpec
    body: Mapping[str, Any]
    gpus: list[list[str]] = field(default_factory=list)  # per replica: its GPUs

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
        """The gateway's config (validated by tessera.gateway.config): Symphony deferred batching with
        ℓ(b) = αb + β fitted to the profile for a static model, else timeout batching on the mean."""
        profile = batch_profile(self.spec)
        slo_ms = self.spec.slo.latency_ms or (
            profile[0][1] * (self.spec.slo.slo_scale or 5.0) if profile else 100.0
        )
        model: dict[str, Any] = {
            "name": self.spec.model.name,
            "namespace": self.namespace,
            "slo_s": slo_ms / 1000.0,
            "workers": [self.worker_url(p.name) for p in self.pod_plans()],
            "batch_sizes": list(self.spec.batching.supported_batch_sizes),
            "max_batch": max(self.spec.batching.supported_batch_sizes),
        }
        if profile:
            alpha, beta = linear_fit(profile)
            model["policy"] = "symphony"
            model["symphony"] = {"alpha": alpha, "beta": beta}
        else:
            model["policy"] = "timeout"
            model["mean_solo_s"] = slo_ms / 1000.0 / 4
        config = {"host": "0.0.0.0", "port": GATEWAY_PORT, "models": [model]}
        GatewayConfig.model_validate(config)
        return config

    def gateway_objects(self, owner: Owner, image: str) -> list[tuple[str, dict[str, Any]]]:
        """(kind, manifest) of the gateway: ConfigMap, Deployment, Service, and the workers' headless
        Service that gives each worker pod its DNS name."""
        name = self.name + GATEWAY_SUFFIX
        labels = {
            contract.LABEL_MODELDEPLOYMENT: self.name,
            contract.LABEL_ROLE: "gateway",
            contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
        }
        meta = {"namespace": self.namespace, "labels": labels, "ownerReferences": [owner.reference()]}
        config = json.dumps(self.gateway_config(), sort_keys=True)
        # A new config rolls the gateway out. sha256, not hash(): str hashes differ between processes, so
        # every operator restart rolled out every gateway for an unchanged config.
        digest = hashlib.sha256(config.encode()).hexdigest()[:16]
        return [
            (
                "configmaps",
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, **meta},
                    "data": {"gateway.json": config},
                },
            ),
            (
                "deployments",
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, **meta},
                    "spec": {
                        "replicas": 1,
                        "selector": {
                            "matchLabels": {
                                contract.LABEL_MODELDEPLOYMENT: self.name,
                                contract.LABEL_ROLE: "gateway",
                            }
                        },
                        "template": {
                            "metadata": {
                                "labels": labels,
                                "annotations": {"tessera.io/config-digest": digest},
                            },
                            "spec": {
                                "containers": [
                                    {
                                        "name": "gateway",
                                        "image": image,
                                        "args": ["gateway", "--config", CONFIG_PATH],
                                        "ports": [{"containerPort": GATEWAY_PORT, "name": "http"}],
                                        "volumeMounts": [{"name": "config", "mountPath": "/etc/tessera"}],
                                    }
                                ],
                                "volumes": [{"name": "config", "configMap": {"name": name}}],
                            },
                        },
                    },
                },
            ),
            (
                "services",
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name, **meta},
                    "spec": {
                        "selector": {
                            contract.LABEL_MODELDEPLOYMENT: self.name,
                            contract.LABEL_ROLE: "gateway",
                        },
                        "ports": [{"name": "http", "port": 80, "targetPort": GATEWAY_PORT}],
                    },
                },
            ),
            (
                "services",
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": self.workers_service, **meta},
                    "spec": {
                        "clusterIP": "None",
                        "selector": {
                            contract.LABEL_MODELDEPLOYMENT: self.name,
                            contract.LABEL_ROLE: "worker",
                        },
                        "ports": [{"name": "http", "port": WORKER_PORT}],
                    },
                },
            ),
        ]


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
