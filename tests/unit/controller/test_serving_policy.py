"""The gateway config the operator writes for a ModelDeployment: which batch scheduler (Orloj for a
model with a latency distribution, Symphony for a static one, spec.scheduler.policy to override) and
that every scheduling field of the spec reaches the scheduler object the gateway builds from it."""

from __future__ import annotations

from typing import Any

import pytest
from tessera.api.resources import parse_modeldeployment
from tessera.controller.serving import (
    ServingRecord,
    ServingSpecError,
    batch_profile,
    choose_policy,
    spec_status,
)
from tessera.gateway.config import GatewayConfig, build_scheduler
from tessera.policy.serving.baselines.batching import TimeoutScheduler
from tessera.policy.serving.orloj import OrlojScheduler
from tessera.policy.serving.orloj.batch_dist import MixMode
from tessera.policy.serving.symphony import SymphonyScheduler


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "w", "image": "w:1"}]}},
            "model": {"name": "resnet", "dynamic": False},
            "slo": {"latencyMs": 100},
            "batching": {
                "supportedBatchSizes": [1, 2, 4, 8],
                "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15, 25, 45]},
            },
            **spec,
        },
    }


def config_of(b: dict[str, Any]) -> dict[str, Any]:
    md = parse_modeldeployment(b)
    rec = ServingRecord("ml", "m", "u", md.spec, b, gpus=[["n1/0"], ["n1/1"]])
    model: dict[str, Any] = rec.gateway_config()["models"][0]
    return model


DYNAMIC = {
    "model": {"name": "bart", "dynamic": True},
    "applications": [
        {"id": "news", "prior": {"parametric": {"type": "normal", "meanMs": 50, "stdMs": 5}}},
        {"id": "papers", "prior": {"samplesMs": [95, 100, 105]}},
        {"id": "short", "prior": {"histogram": {"binWidthMs": 10, "masses": [0, 0.5, 0.5]}}},
    ],
}


def test_static_model_gets_symphony_with_network_delay_folded_in() -> None:
    m = config_of(
        body(network={"ctrlLatencyUs": 500, "dataLatencyPerItemUs": 200, "responseLatencyUs": 1000})
    )
    assert m["policy"] == "symphony"
    # ℓ(b) fit to 10/15/25/45 ms: α = 5 ms, β = 5 ms; + d_data = 0.2 ms per item, + d_ctrl = 0.5 ms.
    assert m["symphony"]["alpha"] == pytest.approx(0.0052) and m["symphony"]["beta"] == pytest.approx(0.0055)
    assert m["symphony"]["get_batch"] == "earlyDropForTarget" and m["symphony"]["timeout"] is None
    assert m["slo_s"] == pytest.approx(0.099)  # the response's 1 ms comes out of the 100 ms budget
    s = build_scheduler(GatewayConfig.model_validate({"models": [m]}).models[0])
    assert isinstance(s, SymphonyScheduler) and s.profiles["resnet"](4) == pytest.approx(0.0263)


def test_dynamic_model_with_priors_gets_orloj_with_the_spec_knobs() -> None:
    m = config_of(
        body(
            **DYNAMIC,
            frontend={"appIdHeader": "X-Tenant", "defaultApp": "news"},
            distribution={"binWidthMs": 2, "batchMixMode": "iidMixture"},
            scheduler={"anticipatedDelayRatePerMs": 1e-3, "candidateOrder": "edfThenLargest"},
            profiler={
                "sampleRate": 0.1,
                "windowSeconds": 60,
                "pickupIntervalSeconds": 2,
                "minSamplesPerApp": 5,
            },
        )
    )
    assert m["policy"] == "orloj" and m["app_header"] == "x-tenant" and m["default_app"] == "news"
    assert sorted(m["priors"]) == ["news", "papers", "short"]
    assert len(m["priors"]["news"]) == 200 and sum(m["priors"]["news"]) / 200 == pytest.approx(0.05, rel=1e-3)
    assert m["priors"]["papers"] == [0.095, 0.1, 0.105]
    assert sorted(set(m["priors"]["short"])) == [0.015, 0.025]  # bin centres in proportion to mass
    assert m["orloj"]["b"] == pytest.approx(1.0) and m["orloj"]["bin_width_s"] == 0.002
    assert m["profiler"] == {"sample_rate": 0.1, "max_share": 0.05}
    cfg = GatewayConfig.model_validate({"models": [m]}).models[0]
    s = build_scheduler(cfg)
    assert isinstance(s, OrlojScheduler)
    assert s.config.b == pytest.approx(1.0) and s.config.mix_mode is MixMode.IID_MIXTURE
    assert s.config.window == 60 and s.config.pickup_interval == 2 and s.config.min_samples == 5
    assert s.config.candidate_order.value == "edf_then_largest"
    # Batch time from the per-batch-size profile: s_k = ℓ(k)/ℓ(1), so a batch of 8 costs 4.5× its longest.
    assert s.config.latency.latency(8, 0.1) == pytest.approx(0.45)


def test_dynamic_model_with_only_a_profile_is_orloj_seeded_from_batch_one() -> None:
    m = config_of(body(model={"name": "bart", "dynamic": True}))
    assert m["policy"] == "orloj" and m["priors"] == {"default": [0.01]}


def test_spec_scheduler_policy_overrides_the_choice() -> None:
    m = config_of(body(**DYNAMIC, scheduler={"policy": "timeout"}, batching={"timeoutMs": 7}))
    assert m["policy"] == "timeout" and m["timeout"]["max_queue_delay_s"] == 0.007
    s = build_scheduler(GatewayConfig.model_validate({"models": [m]}).models[0])
    assert isinstance(s, TimeoutScheduler) and s.max_queue_delay == 0.007
    e = config_of(body(scheduler={"policy": "eager"}))
    assert e["policy"] == "symphony" and e["symphony"]["timeout"] == 0.0
    hg_body = body()
    hg_body["spec"]["batching"]["getBatch"] = "headGreedy"
    hg = config_of(hg_body)
    assert hg["symphony"]["get_batch"] == "headGreedy"
    assert config_of(body())["symphony"]["target_batch"] == "modelRate"
    cg_body = body()
    cg_body["spec"]["batching"]["targetBatch"] = "clusterGpus"
    cg = config_of(cg_body)
    assert cg["symphony"]["target_batch"] == "clusterGpus"
    s = build_scheduler(GatewayConfig.model_validate({"models": [cg]}).models[0])
    assert isinstance(s, SymphonyScheduler) and s.target_batch == "clusterGpus"


def test_a_policy_without_what_it_needs_is_a_spec_error() -> None:
    b = body(scheduler={"policy": "symphony"})
    del b["spec"]["batching"]["latencyModel"]
    with pytest.raises(ServingSpecError, match="needs a batch profile"):
        choose_policy(parse_modeldeployment(b).spec)


def test_p99_multiplier_scales_the_priors_p99() -> None:
    m = config_of(body(**{**DYNAMIC, "applications": DYNAMIC["applications"][1:2]}, slo={"p99Multiplier": 2}))
    assert m["slo_s"] == pytest.approx(0.21)


def profiles_body(gpu_types: list[str], **profile: Any) -> dict[str, Any]:
    """A static model with no perBatchSizeMs table and two measured profiles; ℓ(b) dips at b=4 on the T4."""
    b = body(
        latencyProfiles=[
            {
                "gpuType": "a100",
                "points": [{"batchSize": 1, "latencyMs": 2}, {"batchSize": 2, "latencyMs": 3}],
            },
            {
                "gpuType": "t4",
                "points": [
                    {"batchSize": 1, "latencyMs": 10},
                    {"batchSize": 2, "latencyMs": 20},
                    {"batchSize": 4, "latencyMs": 18},
                ],
                **profile,
            },
        ],
        placement={"gpuTypes": gpu_types, "minGPUs": 1, "maxGPUs": 8},
    )
    b["spec"]["batching"] = {"supportedBatchSizes": [1, 2, 4]}
    return b


def test_profile_follows_placement_gpu_types_and_force_monotonic() -> None:
    spec = parse_modeldeployment(profiles_body(["h100", "t4"])).spec
    assert batch_profile(spec) == [(1, 10.0), (2, 20.0), (4, 20.0)]  # T4's, the dip at 4 raised to 20
    raw = parse_modeldeployment(profiles_body(["t4"], forceMonotonic=False, preprocessMs=1)).spec
    assert batch_profile(raw) == [(1, 11.0), (2, 21.0), (4, 19.0)]
    assert batch_profile(parse_modeldeployment(profiles_body([])).spec) == [(1, 2.0), (2, 3.0)]  # the first
    # What the gateway plans with changes with the chosen profile: Symphony's α, β (ms) in the status too.
    st = spec_status(spec)
    assert st["policy"] == "symphony" and st["sloLatencyMs"] == 100
    # least squares over (1, 10), (2, 20), (4, 20): α = 20/7 ms, β = 10 ms
    assert st["fittedAlphaMs"] == pytest.approx(20 / 7, abs=1e-5) and st["fittedBetaMs"] == pytest.approx(
        10.0
    )
    a100 = config_of(profiles_body(["a100"]))["symphony"]
    assert a100["alpha"] == pytest.approx(0.001) and a100["beta"] == pytest.approx(0.001)


def test_status_reports_the_resolved_slo_for_every_slo_form() -> None:
    papers = {**DYNAMIC, "applications": DYNAMIC["applications"][1:2]}  # solo P99 105 ms
    st = spec_status(parse_modeldeployment(body(**papers, slo={"p99Multiplier": 2})).spec)
    assert st["policy"] == "orloj" and st["sloLatencyMs"] == pytest.approx(210.0)
    assert st["fittedAlphaMs"] is None  # a merge patch removes a Symphony fit left from an earlier policy
    scaled = parse_modeldeployment(body(slo={"sloScale": 3})).spec
    assert spec_status(scaled)["sloLatencyMs"] == pytest.approx(30.0)  # 3 × ℓ(1) = 10 ms
