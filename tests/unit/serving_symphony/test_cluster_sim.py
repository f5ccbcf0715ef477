"""Symphony against eager dispatch and its A.11 baselines in the multi-GPU simulator (spec E.4-E.6).

Small seeded instances of the Fig. 6a case study (α = 1 ms, SLO = 2ℓ(8)); [ref-sim] numbers in the
spec: eager/deferred goodput 0.92 at β/α = 10, deferred busy ≈ o/p with 12 of 32 GPUs at 20 % load."""

from __future__ import annotations

import numpy as np
import pytest
from tessera.policy.serving.baselines.cluster import ClockworkClusterScheduler, ShepherdScheduler
from tessera.policy.serving.common import LinearProfile, Request
from tessera.sim.serving.cluster_sim import (
    ServedModel,
    autoscale,
    identical_models,
    make_cluster_requests,
    make_scheduler,
    max_goodput,
    min_gpus,
    per_model_goodput,
    run_policy,
    simulate_cluster,
    staggered_capacity,
)

MODELS = identical_models(4, alpha=0.001, beta=0.015, slo=0.046)  # SLO = 2ℓ(8)


def test_staggered_capacity_matches_table2_formula() -> None:
    # ResNet50 row of Table 2 (E.3): b_st = 16 at 8 GPUs, 5839.4 r/s for one model.
    m = identical_models(1, alpha=0.001053, beta=0.005072, slo=0.025)
    assert staggered_capacity(m, 8) == pytest.approx(5839.4, abs=0.1)


FAST = ServedModel("fast", LinearProfile(0.001, 0.004, 64), 0.020)
SLOW = ServedModel("slow", LinearProfile(0.010, 0.005, 64), 0.100)


def test_staggered_capacity_of_a_mixed_set_counts_every_model() -> None:
    # 4 GPUs: fast b = 12 (1.25·16 ms ≤ 20 ms), 16 ms per 12 requests; slow b = 7 (1.25·75 ms ≤ 100 ms), 75 ms
    # per 7. Half the requests each: λ·(16/12 + 75/7)/2 ms ≤ 4 GPUs gives λ ≤ 664.0 req/s. The slowest model's
    # capacity alone (4·7/0.075 = 373.3) bounds only the slow half; times the model count it is 746.7.
    got = staggered_capacity([FAST, SLOW], 4)
    assert got == pytest.approx(8 / (16 / 12 + 75 / 7) * 1000, rel=1e-9)
    assert 4 * 7 / 0.075 < got < 2 * 4 * 7 / 0.075
    # The goodput search's ceiling is 1.2 × this bound: Symphony must land below it, not on it.
    g = max_goodput("symphony", [FAST, SLOW], 4, duration=2.0, seed=2)
    assert 0 < g < 0.98 * 1.2 * got, (g, got)


def test_eager_is_symphony_dispatching_at_once() -> None:
    # Symphony §3.4: eager = Algorithm 1 with line 5 changed to exec = now; GETBATCH and drops stay Symphony's.
    reqs = make_cluster_requests(MODELS, 7000, 1.0, np.random.default_rng(0))  # ≈ 2 × Symphony's peak on 8

    def run(policy: str, get_batch: str, **kw: float) -> tuple[int, int, list[int]]:
        st = simulate_cluster(
            policy,
            make_scheduler(policy, MODELS, 8, get_batch=get_batch, **kw),
            reqs,
            MODELS,
            8,
            duration=1.0,
        )
        return st.on_time, st.late, st.batch_sizes

    for gb in ("headGreedy", "earlyDropForTarget"):
        assert run("eager", gb) == run("timeout", gb, timeout=0.0)
    early, greedy = run("eager", "earlyDropForTarget"), run("eager", "headGreedy")
    assert early[0] > 2 * greedy[0] and early[1] == 0  # the early drop keeps eager from collapsing too
    # The old pairing is kept by name: head-greedy eager whatever GETBATCH Symphony gets.
    assert run("eager-headgreedy", "earlyDropForTarget") == greedy


def test_per_model_counts_start_after_the_warm_up() -> None:
    st = run_policy("symphony", [FAST, SLOW], 4, 900.0, duration=2.0, seed=1, warmup=0.5)
    reqs = make_cluster_requests([FAST, SLOW], 900.0, 2.0, np.random.default_rng(1))
    late = [r for r in reqs if r.arrival >= 0.5]
    assert sum(st.model_requests.values()) == len(late)
    assert st.model_requests["slow"] == sum(r.model == "slow" for r in late)
    bad = st.model_bad_rates()
    assert bad["slow"] > 0.01 and set(bad) == {"fast", "slow"}  # 900 req/s is past the bound of 664


def test_per_model_goodput_is_the_slowest_models_p99() -> None:
    # One model: every model's p99 within its SLO is the aggregate 1 % bad-rate criterion, so both searches
    # agree to their resolution. Two models: every probe's verdict is its worst model's bad rate.
    one = [FAST]
    agg = max_goodput("symphony", one, 4, duration=2.0, seed=2, iters=10)
    per = per_model_goodput("symphony", one, 4, measure=2.0, warmup=0.0, seeds=[2], rel_tol=0.005)
    assert per == pytest.approx(agg, rel=0.02)
    probes: list = []
    mixed = per_model_goodput(
        "symphony", [FAST, SLOW], 4, measure=2.0, warmup=0.5, seeds=[2, 3], probes=probes
    )
    assert 0 < mixed < staggered_capacity([FAST, SLOW], 4)
    assert all(p.ok == (p.worst_bad_rate <= 0.01) for p in probes) and any(not p.ok for p in probes)
    assert max(p.rate for p in probes if p.ok) == mixed


def test_deferred_is_never_late_and_every_request_has_one_outcome() -> None:
    for policy in ("symphony", "eager", "eager-headgreedy", "shepherd", "clockwork"):
        st = run_policy(policy, MODELS, 4, 2500, duration=1.0, seed=5)
        assert st.on_time + st.late + st.dropped == st.n
        assert st.late == 0, policy  # GETBATCH only forms batches that finish by the head's deadline


@pytest.mark.slow
def test_symphony_goodput_beats_eager_and_needs_fewer_gpus() -> None:
    g = {
        p: max_goodput(p, MODELS, 8, duration=2.0, seed=2, iters=7) for p in ("symphony", "eager", "shepherd")
    }
    assert g["eager"] < 0.97 * g["symphony"], g  # [ref-sim] 0.86 at β/α = 15
    assert g["shepherd"] < g["symphony"], g
    rate = 5000.0
    n_sym = min_gpus("symphony", MODELS, rate, duration=2.0, seed=2, max_gpus=24)
    n_eager = min_gpus("eager", MODELS, rate, duration=2.0, seed=2, max_gpus=24)
    assert n_sym is not None and n_eager is not None and n_sym < n_eager, (n_sym, n_eager)


def test_load_proportional_consolidation_at_20_percent() -> None:
    models = identical_models(10, alpha=0.001, beta=0.010, slo=0.036)  # E.5.3 setup, 32 GPUs
    rate = 0.2 * 0.8 * staggered_capacity(models, 32)  # ≈ 20 % of the deferred peak (≈ 0.8 of the bound)
    sym = run_policy("symphony", models, 32, rate, duration=1.0, seed=1)
    eager = run_policy("eager", models, 32, rate, duration=1.0, seed=1)
    assert sym.bad_rate == 0 and eager.bad_rate == 0
    assert abs(sym.busy_fraction - 0.2) <= 0.1 and eager.busy_fraction >= 0.9
    assert sym.gpus_used <= 16 and eager.gpus_used == 32  # [ref-sim]: 12 of 32
    busy = np.array(sym.busy)
    assert busy[:8].min() > busy[-8:].max()  # argmin-id keeps the low ids busy, the high ids idle
    assert sym.median_batch > eager.median_batch


def test_autoscaling_releases_idle_gpus_and_adds_when_overloaded() -> None:
    # Paper rule (damping 1): 16 GPUs at 1,500 req/s are 76 % idle, so release N·f = 12 (E.1.6 arithmetic).
    paper = autoscale("symphony", MODELS, 1500.0, 16, epochs=2, duration=1.0, seed=3)
    assert paper[0].advice == -int(16 * paper[0].idle_fraction) < 0
    # Damped release converges without breaking the SLO; overload adds N·r/(1−r) and the bad rate falls.
    down = autoscale("symphony", MODELS, 1500.0, 16, epochs=4, duration=1.0, seed=3, release_damping=0.5)
    assert [s.n_gpus for s in down] == sorted((s.n_gpus for s in down), reverse=True) and down[-1].n_gpus < 10
    assert all(s.bad_rate <= 0.01 for s in down)
    up = autoscale("symphony", MODELS, 4000.0, 3, epochs=3, duration=1.0, seed=3, release_damping=0.5)
    assert up[0].bad_rate > 0.01 and up[0].advice > 0
    assert up[1].n_gpus > 3 and all(s.bad_rate <= 0.01 for s in up[1:])


def test_timeout_zero_is_eager() -> None:
    reqs = make_cluster_requests(MODELS, 2000, 0.5, np.random.default_rng(0))
    a = simulate_cluster("e", make_scheduler("eager", MODELS, 4), reqs, MODELS, 4, duration=0.5)
    b = simulate_cluster(
        "t", make_scheduler("timeout", MODELS, 4, timeout=0.0), reqs, MODELS, 4, duration=0.5
    )
    assert (a.on_time, a.batch_sizes) == (b.on_time, b.batch_sizes)
    with pytest.raises(ValueError, match="timeout k"):
        make_scheduler("timeout", MODELS, 4)
    with pytest.raises(ValueError, match="unknown cluster policy"):
        make_scheduler("nexus", MODELS, 4)


PROF = LinearProfile(1.0, 5.0)


def _drive(
    s: ClockworkClusterScheduler | ShepherdScheduler, arrivals: list[tuple[float, str, float]]
) -> list:
    out = []
    for rid, (t, m, dl) in enumerate(arrivals):
        out += s.advance(t, strictly_before=True)
        s.enqueue(Request(rid, m, t, dl), t)
        out += s.advance(t)
    out += s.advance(1e9)
    return out


def test_clockwork_is_eager_and_picks_earliest_lem() -> None:
    # One GPU; a request of model a arrives at 0 and runs alone at once (eager: median batch 1).
    # While it runs (ℓ(1) = 6), b gets 2 requests (d = 30) and a gets 1 (d = 20); at t = 6 the LEMs are
    # a: 20 − ℓ(1) = 14 and b: 30 − ℓ(2) = 23, so a goes first, then both b's together at 12.
    s = ClockworkClusterScheduler({"a": PROF, "b": PROF}, 1)
    got = _drive(s, [(0.0, "a", 20.0), (1.0, "b", 30.0), (1.5, "b", 30.0), (2.0, "a", 20.0)])
    assert [(b.start, b.model, b.size) for b in got] == [(0.0, "a", 1), (6.0, "a", 1), (12.0, "b", 2)]


def test_shepherd_preempts_only_at_three_times_the_running_batch() -> None:
    # One GPU busy with a batch of 1 (a, ℓ = 6). Model b accumulates: at 2 requests no preemption
    # (2 < 3·1); the third makes a candidate of 3 ≥ 3·1 and preempts (E.6).
    s = ShepherdScheduler({"a": PROF, "b": PROF}, 1)
    got = _drive(s, [(0.0, "a", 50.0), (1.0, "b", 40.0), (1.2, "b", 40.0), (1.4, "b", 40.0)])
    cancelled = s.take_cancelled()
    assert s.preemptions == 1 and len(cancelled) == 1
    assert cancelled[0][0].model == "a" and cancelled[0][1] == 1.4
    kept = [b for b in got if all(b is not c for c, _ in cancelled)]
    assert [(b.start, b.model, b.size) for b in kept] == [
        (1.4, "b", 3),
        (9.4, "a", 1),
    ]  # a requeued, still feasible
    s2 = ShepherdScheduler({"a": PROF, "b": PROF}, 1)
    _drive(s2, [(0.0, "a", 50.0), (1.0, "b", 40.0), (1.2, "b", 40.0)])
    assert s2.preemptions == 0
