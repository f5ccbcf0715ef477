"""Fragmentation-aware scoring, the fast scorer against the reference one, node summaries, the fit index,
slot locality."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tessera.cluster.topology import Locality
from tessera.policy.lanes.placement import (
    Choice,
    FitIndex,
    GpuRequest,
    GpuState,
    NodeSummary,
    PlacementConfig,
    Tenant,
    choose_gpus,
    combined,
    gpu_score,
    gpu_scores,
    why_not,
)

CFG = PlacementConfig()


def _node(*used: int, mem: int = 16000) -> list[GpuState]:
    """GPUs with one tenant each of `used` MiB (0: empty), compute proportional to memory."""
    return [
        GpuState(i, f"GPU-{i}", mem, tenants=(Tenant(u, max(1, 100 * u // mem)),) if u else ())
        for i, u in enumerate(used)
    ]


def test_best_fit_takes_the_tightest_gpu_that_fits() -> None:
    gpus = _node(4000, 10000, 12000, 0)
    choice = choose_gpus(gpus, GpuRequest(1, 4000, 25), CFG)
    assert isinstance(choice, Choice) and choice.gpu_indices == (2,)  # 12000 + 4000 fills GPU 2 exactly
    big = choose_gpus(gpus, GpuRequest(1, 8000, 50), CFG)
    assert isinstance(big, Choice) and big.gpu_indices == (0,)  # only GPU 0 (and the empty 3) fit; 0 is used


def test_a_used_node_beats_an_empty_one_and_whole_gpus_go_where_fewest_remain() -> None:
    req = GpuRequest(1, 4000, 25)
    used, empty = _node(8000, 0, 0, 0), _node(0, 0, 0, 0)
    a, b = choose_gpus(used, req, CFG), choose_gpus(empty, req, CFG)
    assert isinstance(a, Choice) and isinstance(b, Choice) and a.score > b.score
    # a fractional pod that must break a whole GPU: on the node that keeps the fewest whole GPUs
    one_left, three_left = _node(16000, 16000, 16000, 0), _node(16000, 0, 0, 0)
    x, y = choose_gpus(one_left, req, CFG), choose_gpus(three_left, req, CFG)
    assert isinstance(x, Choice) and isinstance(y, Choice) and x.score > y.score
    # a 2-GPU pod goes to the node with exactly 2 whole GPUs, not the one with 4
    gang = GpuRequest(2, 16000, 100)
    two, four = choose_gpus(_node(16000, 16000, 0, 0), gang, CFG), choose_gpus(_node(0, 0, 0, 0), gang, CFG)
    assert isinstance(two, Choice) and isinstance(four, Choice) and two.score > four.score


def test_multi_gpu_pods_take_one_slot_first() -> None:
    # slots of 2: {0,1} {2,3} {4,5} {6,7}; GPUs 0, 3, 5 busy, so only slot {6,7} is wholly free
    gpus = _node(16000, 0, 0, 16000, 0, 16000, 0, 0)
    choice = choose_gpus(gpus, GpuRequest(2, 16000, 100), CFG)
    assert isinstance(choice, Choice) and choice.gpu_indices == (6, 7) and choice.locality == Locality.SLOT
    four = choose_gpus(_node(0, 0, 0, 0, 16000, 0, 16000, 0), GpuRequest(4, 16000, 100), CFG)
    # two whole slots {0,1} {2,3} rather than scattered GPUs
    assert isinstance(four, Choice) and four.gpu_indices == (0, 1, 2, 3) and four.locality == Locality.MACHINE
    quads = PlacementConfig(gpus_per_slot=4)
    q = choose_gpus(_node(0, 0, 0, 0, 0, 0, 0, 0), GpuRequest(4, 16000, 100), quads)
    assert isinstance(q, Choice) and q.locality == Locality.SLOT and len({i // 4 for i in q.gpu_indices}) == 1


def test_no_slot_holds_the_pod_so_it_spans_the_fewest_slots() -> None:
    gpus = _node(16000, 0, 0, 0, 16000, 0, 16000, 0)  # free: 1 | 2 3 | 5 | 7
    choice = choose_gpus(gpus, GpuRequest(3, 16000, 100), CFG)
    assert isinstance(choice, Choice) and {2, 3} <= set(choice.gpu_indices)


@pytest.mark.parametrize("seed", range(5))
def test_fast_scorer_equals_the_reference_and_summary_agrees_with_why_not(seed: int) -> None:
    rng = random.Random(seed)
    cfg = PlacementConfig(
        weights=(("binpack", 1.0), ("interference", 0.7), ("fragmentation", 0.4), ("spread", 0.2)),
        sliver_fraction=0.1,
        best_effort_overcommit=1.5,
    )
    for _ in range(200):
        gpus = []
        for i in range(8):
            tenants = tuple(
                Tenant(
                    rng.randint(500, 5000),
                    rng.randint(1, 40),
                    rng.random(),
                    rng.choice(["best-effort", "latency-critical"]) if k == 0 else "best-effort",
                )
                for k in range(rng.randint(0, 3))
            )
            gpus.append(GpuState(i, f"g{i}", 16000, healthy=rng.random() > 0.1, tenants=tenants))
        req = GpuRequest(
            rng.choice([1, 1, 2]),
            rng.randint(100, 12000),
            rng.randint(1, 100),
            rng.random(),
            rng.choice(["best-effort", "latency-critical"]),
        )
        fitting = [g for g in gpus if why_not(g, req, cfg) is None]
        summary = NodeSummary.of(gpus, cfg)
        assert [g.index for g in summary.fitting(req)] == [
            g.index for g in sorted(fitting, key=lambda g: (g.memory_mib - g.used_memory, g.index))
        ]
        assert summary.fits(req) == (len(fitting) >= req.gpus)
        for g in fitting:
            assert gpu_score(g, req, cfg) == pytest.approx(combined(gpu_scores(g, req, cfg), cfg))
        out = choose_gpus(gpus, req, cfg, summary=summary)
        assert isinstance(out, Choice) == (len(fitting) >= req.gpus)
        if isinstance(out, Choice):
            assert 0.0 <= out.score <= 1.0 and set(out.gpu_indices) <= {g.index for g in fitting}


def test_gpu_state_sums_follow_add_and_remove() -> None:
    a, b = Tenant(4000, 30, 0.2, "latency-critical"), Tenant(2000, 20, 0.9)
    g = GpuState(0, "g", 16000, tenants=(a, b))
    assert (g.used_memory, g.used_compute, g.latency_critical) == (6000, 50, 1)
    assert g.remove(a) and not g.remove(a)
    assert (g.used_memory, g.used_compute, g.latency_critical, g.tenants) == (2000, 20, 0, (b,))


@pytest.mark.parametrize("seed", range(3))
def test_fit_index_answers_as_node_summaries_do(seed: int) -> None:
    rng = random.Random(seed)
    cfg = PlacementConfig(best_effort_overcommit=1.5, max_latency_critical_per_gpu=1)
    index = FitIndex(cfg, width=2, capacity=2)  # both grow: more rows and wider nodes than it starts with
    nodes: list[list[GpuState]] = []
    for _ in range(40):
        gpus = [
            GpuState(
                i,
                f"g{i}",
                rng.choice([8000, 16000]),
                healthy=rng.random() > 0.1,
                tenants=tuple(
                    Tenant(
                        rng.randint(500, 5000),
                        rng.randint(1, 50),
                        rng.random(),
                        rng.choice(["best-effort", "latency-critical"]),
                    )
                    for _ in range(rng.randint(0, 2))
                ),
            )
            for i in range(rng.choice([1, 2, 4, 8]))
        ]
        nodes.append(gpus)
        index.set_row(index.add_row(), gpus)
    index.set_row(5, None)  # row 5 holds nodes[4]: it lost its inventory
    rows = np.array([0, *range(1, len(nodes) + 1)], dtype=np.intp)
    for _ in range(200):
        req = GpuRequest(
            rng.choice([1, 1, 2, 4]),
            rng.randint(100, 16000),
            rng.randint(1, 100),
            rng.random(),
            rng.choice(["best-effort", "latency-critical"]),
        )
        got = index.fits(req, rows).tolist()
        want = [False] + [k != 4 and NodeSummary.of(g, cfg).fits(req) for k, g in enumerate(nodes)]
        assert got == want
