"""Reproduction of Orloj's §5 findings as portable checks on seeded dynamic-DNN workloads (simulated)."""

from typing import Any

import numpy as np
import pytest
from tessera.api.resources import parse_modeldeployment
from tessera.controller.serving import ServingRecord
from tessera.gateway.config import GatewayConfig, build_scheduler
from tessera.policy.serving.symphony import SymphonyScheduler
from tessera.sim.serving.batching_experiment import run_batching
from tessera.sim.serving.dynamic_workload import DynamicModel, make_requests
from tessera.sim.serving.worker_sim import simulate_workers


@pytest.mark.slow
def test_orloj_beats_clockwork_on_bimodal() -> None:
    res = run_batching(
        DynamicModel.evenly_spaced(2), slo_multiples=(3.0, 5.0), n_requests=2500, load=0.6, seed=2
    )
    for mult, row in res.items():
        fr = {k: v.finish_rate for k, v in row.items()}
        assert fr["orloj"] >= fr["clockwork"] + 0.25, (mult, fr)
        assert fr["orloj"] >= max(fr[k] for k in ("nexus", "clipper", "timeout")) - 0.05, (mult, fr)
        assert fr["orloj"] >= 0.9, (mult, fr)
        assert fr["orloj"] >= fr["orloj-edf"] - 0.01, (mult, fr)
        for st in row.values():
            assert st.n == 2500
            assert all(o.finish is None or o.on_time or o.finish > o.request.deadline for o in st.outcomes)


@pytest.mark.slow
def test_orloj_close_to_best_on_static_model() -> None:
    static = DynamicModel.evenly_spaced(1, sigma=0.0005)
    res = run_batching(static, slo_multiples=(3.0, 5.0), n_requests=2500, load=0.6, seed=2)
    for mult, row in res.items():
        fr = {k: v.finish_rate for k, v in row.items()}
        best = max(fr[k] for k in ("clockwork", "nexus", "clipper", "timeout"))
        assert fr["orloj"] >= best - 0.05, (mult, fr)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="paper: Orloj finishes 51-80 % more requests than Clockwork, Nexus and Clipper at tight SLOs (Orloj abstract, "
    "§5, Fig. 4.7: ten real dynamic models with their datasets' execution times, the Azure Functions trace "
    "scaled to the load, one V100, baselines run in the authors' system, 5 runs). Here: one synthetic bimodal "
    "model (modes 50/100 ms, sigma 5 ms; the Fig. 4.8 modality stand-in), Poisson at 0.6 load, 2,500 requests, "
    "one seed, batch sizes 1-16, idealised Nexus and Triton-style timeout batchers without the overheads of "
    "real systems. They reach 0.90-1.00 at >= 3x P99 (Orloj 0.93-1.00). Orloj's lead reaches the paper's "
    "+51 % only over Clockwork (+51 %/+60 % at 3x/5x); over Clipper it is +47 % at 3x and +6 % at 5x, over "
    "Nexus +1 %/-0.2 %, over timeout +3 %/0 % (python -m tessera.sim.serving.batching_experiment --requests "
    "2500 --slo 3,5); docs/results-serving.md",
)
def test_orloj_leads_every_baseline_by_half_at_3x_and_5x() -> None:
    res = run_batching(
        DynamicModel.evenly_spaced(2), slo_multiples=(3.0, 5.0), n_requests=2500, load=0.6, seed=2
    )
    for row in res.values():
        fr = {k: v.finish_rate for k, v in row.items()}
        for base in ("clockwork", "nexus", "clipper", "timeout"):
            assert fr["orloj"] >= 1.51 * fr[base], (base, fr)


def _deployment(model: DynamicModel, slo_ms: float, **spec: Any) -> ServingRecord:
    """A ModelDeployment for the two-modal model as a user writes it: one application per mode with a
    normal prior, the batch profile ℓ(k) ∝ 0.8 + 0.2k (the simulator's batching truth), a latency SLO."""
    sizes = [1, 2, 4, 8, 16]
    body = {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "w", "image": "w:1"}]}},
            "model": {"name": "m", "dynamic": True},
            "slo": {"latencyMs": slo_ms},
            "batching": {
                "supportedBatchSizes": sizes,
                "latencyModel": {
                    "type": "perBatchSize",
                    "perBatchSizeMs": [75 * (0.8 + 0.2 * k) for k in sizes],
                },
                **spec.pop("batching", {}),
            },
            "applications": [
                {"id": a, "prior": {"parametric": {"type": "normal", "meanMs": m * 1000, "stdMs": 5}}}
                for a, m in zip(model.apps, model.modes, strict=True)
            ],
            **spec,
        },
    }
    md = parse_modeldeployment(body)
    return ServingRecord("ml", "m", "u", md.spec, body, gpus=[["n1/0"]])


@pytest.mark.parametrize("mult", [1.5, 2.0])
def test_operator_configured_orloj_beats_timeout_batching_at_a_tight_slo(mult: float) -> None:
    # The scheduler objects the gateway builds from the config the operator writes (build_scheduler), on
    # the simulated GPU: `auto` picks Orloj for this data-dependent model; the same spec with
    # scheduler.policy timeout (k = SLO/4) gets Triton-style timeout batching.
    model = DynamicModel.evenly_spaced(2)
    slo = mult * model.solo_p99(np.random.default_rng(3))
    reqs = make_requests(model, n=2000, load=0.6, slo=slo, rng=np.random.default_rng(2))
    rates = {}
    for name, extra in (
        ("orloj", {}),
        ("timeout", {"scheduler": {"policy": "timeout"}, "batching": {"timeoutMs": slo * 250}}),
    ):
        cfg = GatewayConfig.model_validate(_deployment(model, slo * 1000, **extra).gateway_config())
        assert cfg.models[0].policy == name
        sched = build_scheduler(cfg.models[0])
        assert not isinstance(sched, SymphonyScheduler)
        st = simulate_workers(name, sched, reqs, model.latency, rng=np.random.default_rng(5))
        rates[name] = st.finish_rate
    assert rates["orloj"] >= rates["timeout"] + 0.15, rates
