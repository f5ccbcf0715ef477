"""Symphony Fig. 7a (§3.4.2): deferred vs eager goodput on the mixed model zoo.

The paper: the 35 Table 3 models in one cluster, each with its own SLO, equally popular, Gamma arrivals of
shape 0.1-1.0, 1-4 GPUs per model [S:L196-L211]; goodput = the highest total rate at which every model's p99
meets its SLO [S:L65]; eager = Algorithm 1 with line 5 dispatching at once, GETBATCH and drops unchanged
[S:L182]. Deferred gains "35% to 102%" over eager on the mixed setups [S:L211].

Here with a third of the benchmark's sample (2 seeds × 5 s after a 1 s warm-up, bisection to 2 %) so a test
takes 10-30 s of CPU; ``tests/bench/bench_symphony_fig7a.py`` measures the full table (3 seeds × 10 s,
1 %) reported in docs/results-serving.md. Both policies use the early-drop GETBATCH (the authors' code's).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
from tessera.sim.serving.cluster_sim import per_model_goodput
from tessera.sim.serving.zoo import symphony_zoo

PAPER_LOW, PAPER_HIGH = 1.35, 2.02


def _ratio(
    gpus_per_model: int, shape: float, *, seeds: tuple[int, ...] = (0, 1), measure: float = 5.0
) -> float:
    """Symphony's goodput over eager's; the two searches are independent, so they run side by side in two
    processes (spawn: no threads of the test process copied mid-lock)."""
    models = symphony_zoo()
    kwargs = {
        "measure": measure,
        "warmup": 1.0,
        "seeds": list(seeds),
        "cv": shape**-0.5,
        "rel_tol": 0.02,
        "get_batch": "earlyDropForTarget",
    }
    n = gpus_per_model * len(models)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {p: pool.submit(per_model_goodput, p, models, n, **kwargs) for p in ("symphony", "eager")}
        g = {p: f.result() for p, f in futures.items()}
    return g["symphony"] / g["eager"]


@pytest.mark.slow
def test_fig7a_two_gpus_per_model_poisson_within_the_papers_band() -> None:
    # Measured 1.47x here (benchmark: 7,896 vs 5,555 req/s = 1.42x).
    r = _ratio(2, 1.0)
    assert PAPER_LOW <= r <= PAPER_HIGH, r


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Fig. 7a's band (+35-102 %) at 1 GPU per model, Poisson: measured 1.16x (benchmark 3,188 vs 2,752 "
    "req/s). Symphony reaches 65 % of the staggered bound on 35 GPUs but 81 % on 70; eager 56-57 % on both. "
    "Symphony's first model past its p99 is MobileNetV3Small (20 ms, the tightest SLO), eager's EfficientNetV2L "
    "(the slowest). Likely cause, not isolated: a deferred candidate needs a GPU free inside its window "
    "[d - l(b+1), d - l(b)], and on fewer GPUs, held by long batches of the slow models, a tight-SLO model "
    "misses it more often. Remaining differences from the paper: no network delay, deterministic l(b), the "
    "early-drop GETBATCH for both; the paper does not say which GPU ratios its 35-102 % spans",
)
def test_fig7a_one_gpu_per_model_poisson_within_the_papers_band() -> None:
    r = _ratio(1, 1.0)
    assert PAPER_LOW <= r <= PAPER_HIGH, r


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Fig. 7a's band (+35-102 %) with bursty arrivals, Gamma shape 0.1, 2 GPUs per model: measured "
    "1.04x (benchmark 7,162 vs 6,886 req/s; 1.05x with 20 s measured); 1.07x at 3 and at 4 GPUs per model. Burstiness costs Symphony little (Poisson "
    "7,896 -> 7,162 req/s at 2 GPUs per model) but helps eager (5,555 -> 6,886): bursts batch "
    "for eager what deferral batches for Symphony (at 5,500 req/s eager's mean batch grows from 1.28 to 1.57 "
    "and its GPUs' busy share falls from 0.997 to 0.931). Remaining differences "
    "from the paper: no network delay, deterministic l(b), the early-drop GETBATCH for both; the paper does "
    "not give the ratio per Gamma shape",
)
def test_fig7a_two_gpus_per_model_gamma_0_1_within_the_papers_band() -> None:
    # One seed × 3 s (bursty runs cost more per request): 1.11x at this small sample, deterministic (1.23x
    # with 2 seeds × 5 s, which this test ran until `_ratio` honoured its arguments); the benchmark's
    # 3 seeds × 10 s give 1.04x.
    r = _ratio(2, 0.1, seeds=(0,), measure=3.0)
    assert PAPER_LOW <= r <= PAPER_HIGH, r
