"""Symphony under overload (Symphony §3.5): with the early-drop GETBATCH requests
that cannot meet their deadline in a target-size batch are shed before dispatch, so goodput past the peak
stays at the peak; the head-greedy GETBATCH collapses into small, late batches instead."""

from __future__ import annotations

from tessera.sim.serving.cluster_sim import identical_models, max_goodput, run_policy

MODELS = identical_models(4, alpha=0.001, beta=0.015, slo=0.046, max_batch=64)
GPUS = 8


def test_goodput_stays_within_ten_percent_of_peak_when_load_doubles() -> None:
    peak = max_goodput("symphony", MODELS, GPUS, duration=2.0, seed=2, get_batch="earlyDropForTarget")
    assert peak > 0
    for factor in (1.25, 1.5, 2.0):
        st = run_policy(
            "symphony", MODELS, GPUS, factor * peak, duration=2.0, seed=2, get_batch="earlyDropForTarget"
        )
        assert st.goodput >= 0.9 * peak, (factor, st.goodput, peak)
        # What is not served is shed, not served late: every miss is a drop (A.5 fail-fast).
        assert st.late == 0 and st.dropped == st.n - st.on_time


def test_head_greedy_alone_collapses_past_peak() -> None:
    peak = max_goodput("symphony", MODELS, GPUS, duration=2.0, seed=2, get_batch="headGreedy")
    st = run_policy("symphony", MODELS, GPUS, 2 * peak, duration=2.0, seed=2, get_batch="headGreedy")
    assert st.goodput < 0.5 * peak, (st.goodput, peak)


def test_early_drop_keeps_light_load_whole() -> None:
    st = run_policy("symphony", MODELS, GPUS, 1000.0, duration=2.0, seed=2, get_batch="earlyDropForTarget")
    assert st.bad_rate == 0.0
