"""Reproduction of seed-orloj §6.6 portable checks on seeded dynamic-DNN workloads (simulated)."""

import pytest
from tessera.sim.serving.batching_experiment import run_batching
from tessera.sim.serving.dynamic_workload import DynamicModel


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
    reason="paper headline (+51-80 % finish rate over Clockwork, Nexus and Clipper, [P:L19, L396]) does not reproduce: the "
    "idealised Nexus and Triton-style timeout batchers of this simulator reach 0.90-1.00 at >= 3x P99 "
    "(Orloj 0.93-1.00); the lead holds only over Clockwork (+52 %/+61 % at 3x/5x) and Clipper",
)
def test_orloj_leads_every_baseline_by_half_at_3x_and_5x() -> None:
    res = run_batching(
        DynamicModel.evenly_spaced(2), slo_multiples=(3.0, 5.0), n_requests=2500, load=0.6, seed=2
    )
    for row in res.values():
        fr = {k: v.finish_rate for k, v in row.items()}
        for base in ("clockwork", "nexus", "clipper", "timeout"):
            assert fr["orloj"] >= 1.51 * fr[base], (base, fr)
