"""Symphony Fig. 7a (§3.4.2): deferred vs eager goodput on the mixed model zoo, and Symphony against the
strongest dispatch-at-once baselines.

The paper: the 35 Table 3 models in one cluster, each with its own SLO, equally popular, Gamma arrivals of
shape 0.1-1.0, 1-4 GPUs per model [S:L196-L211]; goodput = the highest total rate at which every model's p99
meets its SLO [S:L65]; eager = Algorithm 1 with line 5 dispatching at once, GETBATCH and drops unchanged
[S:L182]. Deferred gains "35% to 102%" over eager on the mixed setups [S:L211], and the algorithm "works well
with both" GETBATCH rules, head-greedy and early drop [S:L141].

Here Symphony and eager run the early-drop GETBATCH with its target batch as the authors' code computes it
(``targetBatch: modelRate``, the default: the model's own metered rate in the BatchSizeEstimator, spec A.5).
The tests run a smaller sample (2 seeds x 5 s after a 1 s warm-up, bisection to 2 %; the Gamma point 1 seed x
3 s) than ``tests/bench/bench_symphony_fig7a.py``, which measures the table in docs/results-serving.md (3 seeds
x 10 s after 2 s, 1 %); every verdict below agrees with the bench's except where a docstring says otherwise.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from tessera.sim.serving.cluster_sim import per_model_goodput
from tessera.sim.serving.zoo import symphony_zoo

PAPER_LOW, PAPER_HIGH = 1.35, 2.02
SMALL: dict[str, Any] = {"measure": 5.0, "warmup": 1.0, "seeds": [0, 1], "rel_tol": 0.02}
_DIFFERENCES = (
    "Remaining differences from the paper: no network delay, deterministic l(b); the paper does not say which "
    "GPU ratios and Gamma shapes its 35-102 % spans"
)


def _goodputs(
    policies: Sequence[str], gpus_per_model: int, shape: float, sample: dict[str, Any]
) -> dict[str, float]:
    """Each policy's goodput on the zoo; the searches are independent, so they run side by side in two
    processes (spawn: no threads of the test process copied mid-lock)."""
    models = symphony_zoo()
    kwargs = {**sample, "cv": shape**-0.5, "get_batch": "earlyDropForTarget"}
    n = gpus_per_model * len(models)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {p: pool.submit(per_model_goodput, p, models, n, **kwargs) for p in policies}
        return {p: f.result() for p, f in futures.items()}


def _ratio(gpus_per_model: int, shape: float, sample: dict[str, Any]) -> float:
    g = _goodputs(("symphony", "eager"), gpus_per_model, shape, sample)
    return g["symphony"] / g["eager"]


@pytest.fixture(scope="module")
def two_per_model_poisson() -> dict[str, float]:
    """2 GPUs per model, Poisson: Symphony and eager (early drop, modelRate), deferral with the head-greedy
    GETBATCH, and the two dispatch-at-once baselines without the early drop."""
    return _goodputs(
        ("symphony", "eager", "symphony-headgreedy", "eager-headgreedy", "clockwork"), 2, 1.0, SMALL
    )


@pytest.mark.slow
def test_fig7a_two_gpus_per_model_poisson_within_the_papers_band(
    two_per_model_poisson: dict[str, float],
) -> None:
    """On the band's lower edge: 1.354x at this sample (8,080 vs 5,968 req/s). The bench gives 1.344x with
    10 s measured (7,896 vs 5,876), just under 1.35, and 1.370x with 20 s (7,988 vs 5,830), so the point is
    within the band to the measurement's resolution (each search brackets its goodput to 1 %). With
    ``targetBatch: clusterGpus`` the bench gives 1.42x; see docs/results-serving.md for why it is not the
    default."""
    g = two_per_model_poisson
    r = g["symphony"] / g["eager"]
    assert PAPER_LOW <= r <= PAPER_HIGH, g


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Fig. 7a's band (+35-102 %) at 1 GPU per model, Poisson, both on the early-drop GETBATCH with the "
    "modelRate target: measured 1.15x (3,211 vs 2,798 req/s; bench "
    "1.13x, 3,188 vs 2,821). Symphony reaches 65 % of the staggered bound on 35 GPUs but 81 % on 70, eager 58 % "
    "and 60 %. Symphony's first model past its p99 is MobileNetV3Small (20 ms, the tightest SLO), eager's "
    "EfficientNetV2L (the slowest). Likely cause, not isolated: a deferred candidate needs a GPU free inside its "
    "window [d - l(b+1), d - l(b)], and on fewer GPUs, held by long batches of the slow models, a tight-SLO model "
    "misses it more often. No variant here puts it back: with targetBatch: clusterGpus the bench gives 1.16x "
    "(3,188 vs 2,752) and with the head-greedy GETBATCH for both 0.88x (3,234 vs 3,670). " + _DIFFERENCES,
)
def test_fig7a_one_gpu_per_model_poisson_within_the_papers_band() -> None:
    r = _ratio(1, 1.0, SMALL)
    assert PAPER_LOW <= r <= PAPER_HIGH, r


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Fig. 7a's band (+35-102 %) with bursty arrivals, Gamma shape 0.1, 2 GPUs per model, both on the "
    "early-drop GETBATCH with the modelRate target: measured 0.96x "
    "(1 seed x 3 s: 6,886 vs 7,162 req/s; bench 1.01x, 7,575 vs 7,529), and 0.93x/1.05x/1.08x at 1/3/4 GPUs per "
    "model in the bench. Burstiness costs Symphony little (Poisson 7,896 -> 7,575 req/s at 2 GPUs per model) but "
    "helps eager (5,876 -> 7,529): bursts batch for eager what deferral batches for Symphony (at 5,500 req/s on 70 "
    "GPUs eager's mean batch grows from 1.28 to 1.60 and its GPUs' busy share falls from 0.997 to 0.934; "
    "bench_symphony_fig7a.py --stats 5500 --shapes 1.0,0.1 --ratios 2). No variant here puts it back: with "
    "targetBatch: clusterGpus the bench gives 1.04x (7,162 vs 6,886). " + _DIFFERENCES,
)
def test_fig7a_two_gpus_per_model_gamma_0_1_within_the_papers_band() -> None:
    r = _ratio(2, 0.1, {**SMALL, "seeds": [0], "measure": 3.0})
    assert PAPER_LOW <= r <= PAPER_HIGH, r


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="paper: deferral 'works well with both' GETBATCH rules [S:L141]. With the head-greedy GETBATCH for "
    "both (only line 5 differs), 2 GPUs per model, Poisson: deferred 8,172 vs eager 8,264 req/s, 0.99x (bench the "
    "same; 0.81-1.02x across the bench's 12 points). Head-greedy eager reaches 84 % of the staggered bound on 70 GPUs: with one "
    "queue per model and 70 GPUs, dispatching the whole queue at once already batches as much as the SLOs "
    "allow. The paper gives no number for this pairing. " + _DIFFERENCES,
)
def test_deferral_beats_eager_with_the_head_greedy_getbatch(two_per_model_poisson: dict[str, float]) -> None:
    g = two_per_model_poisson
    assert g["symphony-headgreedy"] > g["eager-headgreedy"], g


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Symphony against Clockwork-style dispatch (on every free GPU, the candidate of any model and batch size "
    "with the earliest latest-executable moment, A.11.2) on the zoo, 2 GPUs per model, Poisson: 0.98x (8,080 vs "
    "8,264 req/s; bench 0.96x, 7,896 vs 8,264); bench 0.87x at 1 GPU per model, 0.99x at 3, 1.01x at 4, "
    "0.85-0.95x with Gamma 0.1 arrivals. The paper compares Clockwork only end to end, as the authors' port with "
    "its lock-heavy scheduler and power-of-two batches widened (Table 2: 1,358 vs 5,264 req/s for one ResNet50; "
    "[S:L296, L333]); Fig. 7a compares deferral with eager inside Symphony's framework only. Ours is an idealised "
    "Clockwork: no scheduler overhead, no network delay, deterministic l(b); it dispatches at once without the "
    "early drop, which is what wins on this zoo (head-greedy eager lands on the same goodput at every point)",
)
def test_symphony_beats_clockwork_on_the_zoo(two_per_model_poisson: dict[str, float]) -> None:
    g = two_per_model_poisson
    assert g["symphony"] > g["clockwork"], g


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Symphony (deferred, early drop, modelRate target) against eager dispatch with the head-greedy GETBATCH "
    "on the zoo, 2 GPUs per model, Poisson: 0.98x (8,080 vs 8,264 req/s; bench 0.96x, 7,896 vs 8,264); bench "
    "0.87x at 1 GPU per model, 0.99x at 3, 1.01x at 4, 0.85-0.95x with Gamma 0.1 arrivals. This is our pairing, "
    "not the paper's: its eager keeps Symphony's GETBATCH [S:L182]. It changes two things at once: the early drop "
    "costs Symphony little (8,172 -> 8,080 here) and eager much (8,264 -> 5,968), so dispatching the whole queue "
    "at once without the early drop is the strongest policy on this zoo. " + _DIFFERENCES,
)
def test_symphony_beats_head_greedy_eager_on_the_zoo(two_per_model_poisson: dict[str, float]) -> None:
    g = two_per_model_poisson
    assert g["symphony"] > g["eager-headgreedy"], g
